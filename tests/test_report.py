"""report/: a synthetic run folder in, a self-contained report.html and a terminal table out."""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from toolpolicy.report import RunFileError, format_comparison, write_report
from toolpolicy.report.trajectories import pick_samples

SFT_EVAL = {
    "name": "sft", "checkpoint": "ckpt/sft", "n": 200, "accuracy": 0.61, "tool_calls_per_episode": 0.8,
    "invalid_call_rate": 0.03, "truncated_rate": 0.0, "tokens_per_episode": 40.2, "infra_errors": 0,
    "pass_at_k": {"1": 0.61, "2": 0.7, "4": 0.8},
    "by_difficulty": {
        "easy": {"accuracy": 0.8, "tool_calls_per_episode": 1.2, "invalid_call_rate": 0.02},
        "hard": {"accuracy": 0.42, "tool_calls_per_episode": 0.4, "invalid_call_rate": 0.04},
    },
}
RL_EVAL = {
    "name": "rl", "checkpoint": "ckpt/rl", "n": 200, "accuracy": 0.92, "tool_calls_per_episode": 0.9,
    "invalid_call_rate": 0.01, "truncated_rate": 0.0, "tokens_per_episode": 35.0, "infra_errors": 1,
    "pass_at_k": {"1": 0.92, "2": 0.95, "4": 0.97},
    "by_difficulty": {
        "easy": {"accuracy": 0.97, "tool_calls_per_episode": 0.3, "invalid_call_rate": 0.0},
        "hard": {"accuracy": 0.87, "tool_calls_per_episode": 1.5, "invalid_call_rate": 0.02},
    },
}


def episode(task_id: str, difficulty: str, correct: bool, *, content: str = "The answer is 84.",
            invalid: bool = False) -> dict:
    messages = [
        {"role": "system", "content": "You can call the calculator tool."},
        {"role": "user", "content": "What is 12*7?"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": "12*7"}}]},
        {"role": "tool", "name": "calculator", "content": "84"},
        {"role": "assistant", "content": content},
    ]
    events = [{"kind": "tool_call", "turn": 0, "detail": "calculator"}]
    if invalid:
        messages.insert(2, {"role": "assistant", "content": "<tool_call>{not json</tool_call>"})
        messages.insert(3, {"role": "tool", "name": "calculator", "content": "error: bad_json"})
        events = [{"kind": "invalid_call", "turn": 0, "detail": "bad_json: Expecting property name"},
                  {"kind": "tool_call", "turn": 1, "detail": "calculator"}]
    return {"task": {"id": task_id, "prompt": "What is 12*7?", "answer": "84", "info": {"difficulty": difficulty}},
            "messages": messages, "events": events, "truncated": False, "infra_error": None,
            "reward": 1.0 if correct else 0.0, "correct": correct}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "eval").mkdir()
    (tmp_path / "config.yaml").write_text("model: tiny\nrl:\n  steps: 5\n", encoding="utf-8")
    sft = [{"phase": "sft", "step": s, "loss": 2.0 / (s + 1), "lr": 1e-3} for s in range(2)]
    rl = [{"phase": "rl", "step": s, "reward": 0.5 + 0.1 * s, "accuracy": 0.6 + 0.05 * s,
           "accuracy/easy": 0.8 + 0.03 * s, "accuracy/hard": 0.4 + 0.1 * s, "tool_calls/easy": 1.2 - 0.2 * s,
           "tool_calls/hard": 0.4 + 0.2 * s, "invalid_call_rate": 0.05 - 0.01 * s, "kl": 0.01 * s,
           "entropy": 1.5 - 0.1 * s, "loss": 0.1, "clip_fraction": 0.02} for s in range(5)]
    write_jsonl(tmp_path / "metrics.jsonl", sft + rl)
    (tmp_path / "eval" / "sft.json").write_text(json.dumps(SFT_EVAL), encoding="utf-8")
    (tmp_path / "eval" / "rl.json").write_text(json.dumps(RL_EVAL), encoding="utf-8")
    write_jsonl(tmp_path / "eval" / "sft_samples.jsonl", [
        episode("before-easy-1", "easy", True),
        episode("before-hard-1", "hard", False, content="<script>alert('x')</script> I think 85", invalid=True),
    ])
    write_jsonl(tmp_path / "eval" / "rl_samples.jsonl", [
        episode("after-easy-1", "easy", True),
        episode("after-hard-1", "hard", True),
    ])
    return tmp_path


class TagBalance(HTMLParser):
    """Records every close tag that does not match the innermost open one."""

    VOID = {"meta", "img", "br", "hr", "input", "link"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()


def test_report_is_well_formed_self_contained_and_escaped(run_dir: Path):
    path = write_report(run_dir)
    assert path == run_dir / "report.html" and path.is_file()
    page = path.read_text(encoding="utf-8")

    parser = TagBalance()
    parser.feed(page)
    parser.close()
    assert parser.errors == [] and parser.stack == []

    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) >= 6
    assert all(base64.b64decode(image)[:8] == b"\x89PNG\r\n\x1a\n" for image in images)
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from the network

    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<script" not in page.lower()
    assert "<code>calculator</code>" in page
    assert "&quot;expression&quot;: &quot;12*7&quot;" in page
    assert "invalid call" in page and "bad_json" in page
    for task_id in ("before-easy-1", "before-hard-1", "after-easy-1", "after-hard-1"):
        assert task_id in page
    assert "61.0% &rarr; 92.0%" in page and "+31.0 pts" in page  # headline accuracy
    assert "pass@4" in page
    assert "<details><summary>config.yaml" in page and "steps: 5" in page
    # The one piece this synthetic run lacks is a rollout store (tests/test_viewer.py has one).
    assert re.findall(r"Not available: [^<]*", page) == [
        "Not available: no rl/rollouts/step_*.parquet (store_rollouts was off, or RL has not run)."]


def test_missing_pieces_are_reported_not_crashed(run_dir: Path):
    (run_dir / "eval" / "rl.json").unlink()
    (run_dir / "eval" / "rl_samples.jsonl").unlink()
    (run_dir / "config.yaml").unlink()
    page = write_report(run_dir).read_text(encoding="utf-8")
    assert "Not available: eval/rl.json not found." in page
    assert "Not available: eval/rl_samples.jsonl not found." in page
    assert "Not available: config.yaml not found." in page
    assert "before-hard-1" in page  # what exists is still shown


def test_malformed_metrics_line_names_file_and_line(run_dir: Path):
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text(encoding="utf-8").splitlines()
    lines[2] = '{"phase": "rl", "step": 0, "reward": '
    metrics.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(RunFileError, match=r"metrics\.jsonl:3: not valid JSON"):
        write_report(run_dir)


def test_reporting_a_folder_that_is_no_run_says_so_and_what_to_run(tmp_path: Path, capsys):
    from toolpolicy.cli import main

    missing = tmp_path / "nope"
    assert main(["report", str(missing)]) == 1
    err = capsys.readouterr().err
    assert f"{missing}: no such run folder" in err and f"toolpolicy demo --set run.dir={missing}" in err
    assert "Errno" not in err and not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 1
    assert f"{empty}: no metrics.jsonl, config.yaml or eval results to report" in capsys.readouterr().err
    assert not (empty / "report.html").exists()


def test_format_comparison_rows_and_changes():
    table = format_comparison(SFT_EVAL, RL_EVAL)
    lines = {line.split("  ")[0].strip(): line.split() for line in table.splitlines()[2:]}
    assert table.splitlines()[0].startswith("sft -> rl")
    assert lines["accuracy"][-4:] == ["61.0%", "92.0%", "+31.0", "pts"]
    assert lines["accuracy hard"][-4:] == ["42.0%", "87.0%", "+45.0", "pts"]
    assert lines["tool calls/episode easy"][-3:] == ["1.20", "0.30", "-0.90"]
    assert lines["tool calls/episode hard"][-3:] == ["0.40", "1.50", "+1.10"]
    assert lines["invalid-call rate"][-4:] == ["3.0%", "1.0%", "-2.0", "pts"]
    assert [label for label in lines if label.startswith("pass@")] == ["pass@1", "pass@2", "pass@4"]
    assert lines["pass@4"][-4:] == ["80.0%", "97.0%", "+17.0", "pts"]
    assert "n/a" in format_comparison(SFT_EVAL, {"name": "rl"})


def test_policy_rows_by_category_show_where_wrong_writes_happen():
    def summary(name: str, wrong: float) -> dict:
        return {"name": name, "violations_per_episode": 0.5, "wrong_writes_per_episode": wrong / 2, "by_category": {
            "ambiguous": {"accuracy": 0.25, "wrong_writes_per_episode": wrong},
            "feasible": {"accuracy": 0.75, "wrong_writes_per_episode": 0.0}}}

    table = format_comparison(summary("off", 0.5), summary("on", 0.25))
    lines = {line.split("  ")[0].strip(): line.split() for line in table.splitlines()[2:]}
    assert lines["success ambiguous"][-4:] == ["25.0%", "25.0%", "+0.0", "pts"]
    assert lines["wrong-state writes/episode ambiguous"][-3:] == ["0.50", "0.25", "-0.25"]
    assert "wrong-state writes/episode feasible" not in lines  # none in either: no row


def test_pick_samples_mixes_difficulty_and_outcome():
    samples = [episode(f"e{i}", "easy", True) for i in range(5)] + [episode("h-wrong", "hard", False),
                                                                     episode("h-right", "hard", True)]
    picked = [s["task"]["id"] for s in pick_samples(samples, limit=4)]
    assert picked == ["e0", "h-right", "h-wrong", "e1"]
