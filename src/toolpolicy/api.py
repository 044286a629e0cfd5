"""toolpolicy from Python: what the `sft`, `train`, `eval` and `export` commands do, as functions.

A notebook or a script drives a run the way the command line does, with the same config
files, run folders and results:

    import toolpolicy as tp

    cfg = tp.load_config("src/toolpolicy/configs/smoke.yaml", ["run.dir=runs/mine"])
    sft = tp.sft(cfg)                   # the SFT model: RUN_DIR/sft/final
    rl = tp.train(cfg, init_from=sft)   # the RL model: RUN_DIR/rl/final
    summary = tp.evaluate(cfg, rl)      # accuracy, pass^k, violations, by category ...
    print(tp.format_summary(summary))

Each call writes the resolved config into the run folder first, as the command does, so
the folder says what produced it. `load_config(path, overrides)` takes `--set`'s
"section.field=value" strings; `replaced(cfg, {"section.field": value})` changes a loaded
config (each changed section is validated again; the checks across sections run in
`load_config`: prefer overrides). Errors are the command line's:
`ConfigError` for a config, `CheckpointError` for a model folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolpolicy.config import Config, ConfigError, replaced

__all__ = ["Config", "ConfigError", "bfcl_v4", "evaluate", "export", "format_summary", "load_config", "replaced", "sft", "train"]


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """The config of the YAML file `path` (None: the defaults) with `--set` overrides
    ("section.field=value"), typed and checked as every command checks it."""
    from toolpolicy.build import load_config as checked_config

    return checked_config(path, overrides)


def sft(cfg: Config, resume: bool = False) -> Path:
    """SFT as `toolpolicy sft CONFIG` (or `--resume`, from the run folder's last checkpoint):
    the final model's folder."""
    from toolpolicy.build import prepare_run_dir
    from toolpolicy.trainer.sft import train_sft

    return train_sft(cfg, prepare_run_dir(cfg), resume=resume)


def train(cfg: Config, init_from: str | Path | None = None, resume: bool = False) -> Path:
    """RL as `toolpolicy train CONFIG`, from `init_from` (else the config's): the final model's folder."""
    from toolpolicy.build import prepare_run_dir
    from toolpolicy.checks import require_init_from
    from toolpolicy.trainer.rl import train_rl

    if init_from is not None:
        cfg = replaced(cfg, {"rl.init_from": str(init_from)})
    require_init_from(cfg)
    return train_rl(cfg, prepare_run_dir(cfg), resume=resume)


def evaluate(cfg: Config, checkpoint: str | Path | None = None, name: str = "eval", gate: bool = True) -> dict[str, Any]:
    """Score a model on the environment's held-out tasks, as `toolpolicy eval CONFIG`:
    `checkpoint`, else the config's eval.checkpoint, else the run folder's newest model (or
    the served model at eval.served_url). Writes RUN_DIR/eval/NAME.json and returns its summary."""
    from toolpolicy.eval.run import evaluate as run_evaluation

    run_dir = Path(cfg.run.dir)
    return run_evaluation(cfg, scored_model(cfg, checkpoint), name, run_dir, gate=gate)


def bfcl_v4(cfg: Config, checkpoint: str | Path | None = None, categories: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """BFCL v4's single-turn categories, as `toolpolicy eval CONFIG --bfcl v4 [--categories C,..]
    [--limit N]`: the summary it writes to RUN_DIR/eval/bfcl_v4.json (eval.samples answers an
    entry where eval.temperature is above 0, with pass@k and pass^k; one where it is 0)."""
    from toolpolicy.eval.bfcl import first_per_category, score_bfcl
    from toolpolicy.eval.bfcl_v4 import bfcl_scores, load_v4, parse_categories

    entries = first_per_category(load_v4(parse_categories(categories)), limit)
    return score_bfcl(cfg, scored_model(cfg, checkpoint), entries, Path(cfg.run.dir), name="bfcl_v4", groups=bfcl_scores)


def export(source: str | Path, out: str | Path, merge: bool = False, dtype: str = "float32") -> Path:
    """What `toolpolicy export` does: write `source`'s model (a run's newest, see
    `toolpolicy.model.newest_model`) to `out` with its tokenizer; a LoRA adapter folded into
    its base with `merge`, else saved as the adapter. `dtype` "bfloat16" halves the files (an
    adapter to ship in a repository); loading casts them back to the precision the run asks
    for. A chat template with no tools section is written with one in front
    (`served_template`), so a server shows the model its tools. README.md is the model card
    (`toolpolicy.report.card`): base, run config, scores."""
    import sys

    import torch

    from toolpolicy.chat.tools_block import served_template
    from toolpolicy.model import load_trained, newest_model
    from toolpolicy.model.adapters import merged
    from toolpolicy.report.card import card_facts, model_card

    exported = newest_model(source)
    facts = card_facts(Path(source), exported, Path(out).name, dtype, merge)  # a broken run file stops before anything is written
    model, tokenizer, _ = load_trained(exported)  # no chat format needed: weights and files only
    model = merged(model) if merge else model
    model.to(getattr(torch, dtype)).save_pretrained(out)
    with_tools = served_template(tokenizer)
    if with_tools is not None:
        tokenizer.chat_template = with_tools
        print(
            f"{out}: the model's chat template has no tools section; the folder's template lists tools in a Hermes block in "
            "the system message, as model.chat_tools: system does in training (src/toolpolicy/chat/tools_block.py)",
            file=sys.stderr,
        )
    tokenizer.save_pretrained(out)
    (Path(out) / "README.md").write_text(model_card(facts), encoding="utf-8")
    return Path(out)


def format_summary(summary: dict[str, Any]) -> str:
    """An evaluation summary as the tables `toolpolicy eval` prints."""
    from toolpolicy.report import format_summary as tables

    return tables(summary)


def scored_model(cfg: Config, checkpoint: str | Path | None = None) -> Path | None:
    """The model a scoring call runs (`toolpolicy eval` and this API): the one given, else none
    when the config names a served model (eval.served_url), else the config's eval.checkpoint,
    else the run folder's newest (rl/final, sft/final, model); FileNotFoundError when it has none."""
    if checkpoint is not None:
        return Path(checkpoint)
    if cfg.eval.served_url:
        return None
    if cfg.eval.checkpoint:
        return Path(cfg.eval.checkpoint)
    from toolpolicy.model import run_model

    found = run_model(cfg.run.dir)
    if found is None:
        raise FileNotFoundError(f"{cfg.run.dir}: no model found (looked in rl/final, sft/final, model); set eval.checkpoint")
    return found
