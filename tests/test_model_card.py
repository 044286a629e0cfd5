"""The model card `toolpolicy export` writes: what the folder holds and loads on, the run's
config, and only the evaluations of the exported model itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolpolicy.report.card import CardFacts, card_facts, evaluations_of, model_card
from toolpolicy.report.run_files import RunFileError

ADAPTER = {"base_model_name_or_path": "models/base-merged", "r": 16, "lora_alpha": 32, "target_modules": ["v_proj", "q_proj"]}
BFCL = {
    "n": 3,
    "accuracy": 2 / 3,
    "model": "runs/x/sft/final",
    "by_category": {"irrelevance": {"n": 1, "accuracy": 1.0}, "parallel": {"n": 2, "accuracy": 0.5}},
    "groups": {"non_live": 0.5, "live": None},
}
TASKS = {"n": 96, "accuracy": 0.9375, "checkpoint": "runs/x/rl/final", "tool_calls_per_episode": 1.25, "pass_hat_k": {"1": 0.9375, "2": 0.875}}


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "sft" / "final").mkdir(parents=True)
    (run / "sft" / "final" / "adapter_config.json").write_text(json.dumps(ADAPTER))
    (run / "config.yaml").write_text("run:\n  dir: runs/x\nmodel:\n  lora_rank: 16\n")
    (run / "eval").mkdir()
    (run / "eval" / "bfcl_v4.json").write_text(json.dumps({**BFCL, "model": str(run / "sft" / "final")}))
    (run / "eval" / "base.json").write_text(json.dumps({**BFCL, "model": "models/smollm2"}))
    (run / "eval" / "sft.json").write_text(json.dumps({**TASKS, "checkpoint": str(run / "sft" / "final")}))
    return run


def test_an_adapter_card_names_its_base_its_settings_and_the_command_that_scores_it() -> None:
    card = model_card(CardFacts(name="ship", source="runs/x/sft/final", dtype="bfloat16", adapter=ADAPTER, scores={"bfcl_v4": BFCL}))
    assert card.startswith("# ship\n")
    assert "A LoRA adapter (rank 16, alpha 32, on q_proj, v_proj) in bfloat16" in card
    assert "`models/base-merged`" in card and "from `runs/x/sft/final`" in card
    assert "toolpolicy eval CONFIG --bfcl v4 --set eval.checkpoint=PATH/TO/ship" in card  # a BFCL model is scored on BFCL


def test_a_merged_export_says_whole_weights_with_the_adapter_folded_into_its_base() -> None:
    card = model_card(CardFacts(name="m", source="runs/x/sft/final", dtype="float32", adapter=ADAPTER, merged=True))
    assert "Whole model weights in float32" in card and "folded into `models/base-merged`" in card
    assert "LoRA adapter (rank" not in card and "toolpolicy eval CONFIG --set eval.checkpoint=m" in card
    assert "Whole model weights in float32, written by `toolpolicy export` from `m0`." in model_card(CardFacts("m", "m0", "float32"))


def test_scores_render_bfcl_categories_and_groups_and_task_pass_rates() -> None:
    card = model_card(CardFacts(name="s", source="s0", dtype="float32", scores={"bfcl_v4": BFCL, "rl": TASKS}))
    assert "| irrelevance | 1 | 100.0% |\n| parallel | 2 | 50.0% |\n| all | 3 | 66.7% |" in card
    assert "- non_live: 50.0%" in card and "live: " not in card.replace("non_live", "")  # an unscored group is left out
    assert "- episodes: 96, accuracy 93.8%, tool calls 1.25 an episode" in card
    assert "- pass^1 93.8%, pass^2 87.5%" in card
    assert card.index("## bfcl_v4") < card.index("## rl")


def test_a_run_card_holds_the_config_and_only_the_exported_models_evaluations(tmp_path: Path) -> None:
    run = _run(tmp_path)
    exported = run / "sft" / "final"
    assert sorted(evaluations_of(run, exported)) == ["bfcl_v4", "sft"]  # base.json scored another model
    facts = card_facts(run, exported, "ship", "bfloat16", merged=False)
    assert facts.adapter == ADAPTER and facts.config_text == (run / "config.yaml").read_text()
    card = model_card(facts)
    assert "## The run's config\n\n```yaml\nrun:\n  dir: runs/x\nmodel:\n  lora_rank: 16\n```\n" in card
    assert "the run's `eval/bfcl_v4.json`" in card and "eval/base.json" not in card


def test_a_checkpoint_folder_card_has_no_run_config_and_no_scores(tmp_path: Path) -> None:
    run = _run(tmp_path)
    folder = run / "sft" / "final"
    facts = card_facts(folder, folder, "again", "bfloat16", merged=False)
    assert facts.config_text is None and facts.scores == {}
    assert "## " not in model_card(facts)


def test_a_broken_eval_file_stops_the_card_with_its_name(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "eval" / "sft.json").write_text('{"n": 96,')
    with pytest.raises(RunFileError, match=r"eval/sft\.json:1: not valid JSON"):
        card_facts(run, run / "sft" / "final", "ship", "bfloat16", merged=False)
