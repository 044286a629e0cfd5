"""The real commands, end to end: `toolpolicy demo` in the smoke configuration, config
errors, and exact resume of a killed run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from toolpolicy.cli import main
from toolpolicy.trainer.config import ConfigError, load_config

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
    for key in ("reward", "accuracy", "accuracy/easy", "accuracy/hard", "tool_calls/easy", "invalid_call_rate", "kl", "entropy"):
        assert all(key in r for r in rl), key
    for name in ("sft", "rl"):
        result = json.loads((smoke_run / "eval" / f"{name}.json").read_text())
        assert result["n"] == 24 and 0.0 <= result["accuracy"] <= 1.0
        assert set(result["by_difficulty"]) <= {"easy", "hard"}
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


def test_cli_reports_config_errors_without_a_traceback(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("group_size: 1\n")
    assert main(["train", str(bad)]) == 2
    assert "group_size" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def _rl_metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if r["phase"] == "rl"]


def test_killed_run_resumes_exactly(smoke_run: Path, tmp_path: Path):
    """DESIGN contract 7: kill -9 after a checkpoint, resume, and match an uninterrupted run."""
    common = ["--set", f"init_from={smoke_run / 'sft' / 'final'}", "--set", "rl_steps=6", "--set", "checkpoint_every=2"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["train", str(SMOKE), "--set", f"run_dir={straight}", *common]) == 0

    command = [sys.executable, "-m", "toolpolicy.cli", "train", str(SMOKE), "--set", f"run_dir={killed}", *common]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "rl" / "checkpoints" / "step_000002" / "trainer_state.pt").exists():
        assert time.time() < deadline and process.poll() is None, "no checkpoint appeared"
        time.sleep(0.05)
    process.kill()
    process.wait()
    assert main(["train", "--resume", str(killed)]) == 0

    assert [r["step"] for r in _rl_metrics(killed)] == [1, 2, 3, 4, 5, 6]
    assert _rl_metrics(killed) == _rl_metrics(straight)


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
    executed = sum(json.loads((run_dir / "eval" / f"{n}.json").read_text())["tool_calls_per_episode"] * 16 for n in ("first", "second"))
    assert executed > 0 and result.records >= round(executed)  # every executed call was decided and logged
