"""The real commands, end to end: `toolpolicy demo` in the smoke configuration, config
errors, bugs that show their traceback, the audit log across phases (resume: test_resume.py)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from toolpolicy.cli import main
from toolpolicy.config import ConfigError, load_config

from conftest import SMOKE


def test_demo_writes_a_complete_run_folder(smoke_run: Path):
    for name in ("config.yaml", "metrics.jsonl", "report.html", "summary.json", "model/config.json",
                 "sft/final/model.safetensors", "rl/final/model.safetensors", "eval/sft.json", "eval/rl.json"):
        assert (smoke_run / name).is_file(), name
    config = yaml.safe_load((smoke_run / "config.yaml").read_text())
    assert config["init_from"].endswith("sft/final")
    lines = [json.loads(line) for line in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["phase"] == "sft"] == list(range(1, 61))
    rl = [r for r in lines if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2, 3, 4]
    for key in ("reward", "accuracy", "accuracy/easy", "accuracy/hard", "tool_calls/easy", "invalid_call_rate", "entropy"):
        assert all(key in r for r in rl), key
    assert not any("kl" in r for r in rl), "log_kl is off by default: no reference forward for a metric"
    assert all(r["tokens/prefill"] > 0 and r["tokens/decode"] > 0 for r in rl)
    trained = [r for r in rl if r["trained_episodes"]]
    assert trained, "no RL step of the smoke run trained"
    for r in trained:  # old log-probs are the rollout's own: the update starts at ratio 1, nothing clipped
        assert abs(r["ratio"] - 1) < 1e-4 and r["ratio_max"] < 1 + 1e-3 and r["clip_frac"] == 0.0, r
        assert r["mismatch/abs_max"] < 1e-4 and r["mismatch/truncated"] == 0.0, r  # the hf sampler is the trainer
        assert 0 < r["tokens/update"] and r["tokens/reference"] == 0
    for name in ("sft", "rl"):
        result = json.loads((smoke_run / "eval" / f"{name}.json").read_text())
        assert result["n"] == 24 and result["infra_errors"] == 0
        # accuracy is the mean over episodes: the difficulties' accuracies weighted by their episodes
        by_difficulty = result["by_difficulty"]
        assert set(by_difficulty) == {"easy", "hard"} and sum(d["n"] for d in by_difficulty.values()) == 24
        correct = sum(round(d["accuracy"] * d["n"]) for d in by_difficulty.values())
        assert result["accuracy"] == correct / 24 and result["pass_hat_k"]["1"] == pytest.approx(result["accuracy"])
        samples = (smoke_run / "eval" / f"{name}_samples.jsonl").read_text().splitlines()
        assert len(samples) == 4 and all(json.loads(s)["messages"][0]["role"] == "system" for s in samples)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images = 0
        self.text = []

    def handle_starttag(self, tag, attrs):
        if tag == "img" and dict(attrs).get("src", "").startswith("data:image/png;base64,"):
            self.images += 1

    def handle_data(self, data):
        self.text.append(data)


def test_report_is_well_formed(smoke_run: Path):
    parser = _Tags()
    parser.feed((smoke_run / "report.html").read_text())
    text = " ".join(parser.text)
    assert parser.images >= 6
    assert "calculator" in text and "Answer" in text


def test_config_errors_name_the_file_and_field(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rl_steps: many\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    message = str(err.value)
    assert str(bad) in message and "'rl_steps'" in message and "'learning_rate'" in message and "unknown field" in message
    with pytest.raises(ConfigError, match="'sft_lr'"):
        load_config(None, ["sft_lr=-1"])
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["sft_lr"])
    assert load_config(None, ["rl_steps=7"]).rl_steps == 7


def test_a_bug_shows_its_traceback_and_a_user_error_does_not(tmp_path: Path, capsys, monkeypatch):
    import toolpolicy.eval.run

    def broken(*args, **kwargs):
        raise ValueError("a bug in evaluate")

    monkeypatch.setattr(toolpolicy.eval.run, "evaluate", broken)
    shipped = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"
    with pytest.raises(ValueError, match="a bug in evaluate"):  # not turned into "error: ..." and exit 2
        main(["eval", str(SMOKE), "--set", f"run_dir={tmp_path}", "--set", f"eval_checkpoint={shipped}"])
    assert main(["eval", str(SMOKE), "--set", f"run_dir={tmp_path}", "--trials", "0"]) == 2
    assert "--trials must be at least 1" in capsys.readouterr().err


def test_cli_reports_config_errors_without_a_traceback(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("group_size: 1\n")
    assert main(["train", str(bad)]) == 2
    assert "group_size" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_demo_starts_from_a_cold_start_checkpoint(smoke_run: Path, tmp_path: Path):
    run_dir = tmp_path / "warm"
    code = main(["demo", "--config", str(SMOKE), "--set", f"run_dir={run_dir}",
                 "--set", f"cold_start={smoke_run / 'sft' / 'final'}", "--set", "rl_steps=2"])
    assert code == 0
    assert not (run_dir / "sft").exists(), "SFT must be skipped with a cold start"
    assert (run_dir / "rl" / "final" / "model.safetensors").is_file() and (run_dir / "report.html").is_file()


def test_missing_cold_start_is_a_clear_error(tmp_path: Path, capsys):
    code = main(["demo", "--config", str(SMOKE), "--set", f"run_dir={tmp_path / 'x'}", "--set", f"cold_start={tmp_path / 'nope'}"])
    assert code == 2
    assert "nope" in capsys.readouterr().err


def test_audit_log_spans_every_phase_of_a_run(tmp_path: Path):
    """Each engine closes its audit log, so one evaluation after another appends to one chain."""
    from toolpolicy.gate import verify

    shipped = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"  # a model that calls the tool
    run_dir = tmp_path / "audited"
    common = ["--set", f"run_dir={run_dir}", "--set", "audit=true", "--set", f"eval_checkpoint={shipped}",
              "--set", "eval_tasks=8", "--set", "eval_samples=2"]
    assert main(["eval", str(SMOKE), *common, "--name", "first"]) == 0
    assert main(["eval", str(SMOKE), *common, "--name", "second"]) == 0
    result = verify(run_dir / "audit.jsonl")
    assert result.ok, result.problems
    records = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert len({r["decision_id"] for r in records}) == len(records) == result.records  # each decision once
    # Allow-all on calc: every call the model wrote well enough to reach the gate is allowed and
    # runs; the gate's own denials are malformed calls (unknown tool, arguments off the schema).
    executed = sum(round(json.loads((run_dir / "eval" / f"{n}.json").read_text())["tool_calls_per_episode"] * 16) for n in ("first", "second"))
    assert executed > 0 and sum(r["decision"] == "allow" for r in records) == executed
    assert all(r["rule_ids"][0].startswith("gate:") for r in records if r["decision"] != "allow")


def test_a_refused_resume_leaves_the_runs_config_as_it_was(tmp_path: Path, capsys):
    """Resuming with an override that makes the config unusable is an error before anything
    is written: the run folder's config, the record of how the run started, is kept."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = yaml.safe_dump({**yaml.safe_load(SMOKE.read_text()), "init_from": "checkpoints/calc-sft", "run_dir": str(run_dir)})
    (run_dir / "config.yaml").write_text(saved)
    assert main(["train", "--resume", str(run_dir), "--set", "init_from="]) == 2
    assert "init_from is empty" in capsys.readouterr().err
    assert (run_dir / "config.yaml").read_text() == saved
