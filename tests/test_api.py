"""The Python API (toolpolicy.api): the commands' work as functions, from `import toolpolicy`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import toolpolicy as tp

from conftest import SMOKE

TINY = ["sft.steps=3", "sft.examples=16", "embedded.tokenizer_texts=50", "rl.steps=1", "rl.prompts_per_step=2", "rl.group_size=2",
        "eval.tasks=2", "eval.samples=1", "rl.max_idle_steps=0"]


def test_sft_train_and_evaluate_from_python_write_the_run_folder_the_commands_write(tmp_path):
    cfg = tp.load_config(SMOKE, [*TINY, f"run.dir={tmp_path}"])
    with pytest.raises(tp.ConfigError, match="'rl.init_from' is empty"):
        tp.train(cfg)
    sft = tp.sft(cfg)
    assert sft == tmp_path / "sft" / "final" and (sft / "config.json").is_file()
    rl = tp.train(cfg, init_from=sft)
    assert rl == tmp_path / "rl" / "final" and (rl / "config.json").is_file()
    assert tp.load_config(tmp_path / "config.yaml").rl.init_from == str(sft)  # the folder says what produced it
    summary = tp.evaluate(cfg)  # the run's newest model: rl/final
    assert summary == json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert summary["n"] == 2 and "accuracy" in summary
    assert "accuracy" in tp.format_summary(summary)
    phases = [json.loads(line)["phase"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert phases.count("sft") == 3 and phases.count("rl") == 1


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        tp.trian  # noqa: B018


def test_the_model_scored_by_default_is_the_runs_newest_adapter_or_weights(tmp_path):
    """A LoRA run's sft/final holds an adapter (adapter_config.json, no config.json): it is the
    run's newest model, as weights are; rl/final comes before it; an empty run is an error."""
    from toolpolicy.api import scored_model

    cfg = tp.load_config(SMOKE, [f"run.dir={tmp_path}"])
    with pytest.raises(FileNotFoundError, match="no model found"):
        scored_model(cfg)
    (tmp_path / "sft" / "final").mkdir(parents=True)
    (tmp_path / "sft" / "final" / "adapter_config.json").write_text("{}")
    assert scored_model(cfg) == tmp_path / "sft" / "final"
    (tmp_path / "rl" / "final").mkdir(parents=True)
    assert scored_model(cfg) == tmp_path / "sft" / "final"  # an empty folder holds no model
    (tmp_path / "rl" / "final" / "config.json").write_text("{}")
    assert scored_model(cfg) == tmp_path / "rl" / "final"
    assert scored_model(cfg, "elsewhere") == Path("elsewhere")  # the one given comes first
