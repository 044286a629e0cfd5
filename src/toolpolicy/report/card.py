"""The README.md `toolpolicy export` writes beside a model (its model card): what the folder
holds, what it loads on, how the run that made it was configured and how that very model
scored, all read from the files the run keeps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpolicy.model.adapters import ADAPTER_CONFIG, adapter_config, is_adapter
from toolpolicy.report.run_files import read_eval


@dataclass(frozen=True)
class CardFacts:
    name: str
    """The exported folder's name."""
    source: str
    """The model that was exported (a run's rl/final or sft/final, or a checkpoint folder)."""
    dtype: str
    """The precision of the weights in the files."""
    adapter: Mapping[str, Any] | None = None
    """The source's LoRA adapter config (adapter_config.json); None for whole weights."""
    merged: bool = False
    """The adapter was folded into its base: the folder holds whole weights."""
    config_text: str | None = None
    """The run's resolved config.yaml, when the source is a run."""
    scores: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Evaluation name -> the run's summary of it, for evaluations of this very model."""


def model_card(facts: CardFacts) -> str:
    """Markdown for the exported folder's README.md."""
    adapter = facts.adapter
    whole = adapter is None or facts.merged
    if whole:
        folded = f" with its LoRA adapter folded into `{adapter['base_model_name_or_path']}`" if adapter is not None else ""
        what = f"Whole model weights in {facts.dtype}, written by `toolpolicy export` from `{facts.source}`{folded}."
    else:
        base = adapter["base_model_name_or_path"]
        modules = ", ".join(sorted(adapter.get("target_modules") or []))
        what = (
            f"A LoRA adapter (rank {adapter['r']}, alpha {adapter['lora_alpha']}, on {modules}) in {facts.dtype}, written by "
            f"`toolpolicy export` from `{facts.source}`. It loads on the base model folder `{base}` (its "
            f"`{ADAPTER_CONFIG}` names it); that folder must exist where the adapter is loaded from."
        )
    bfcl = "--bfcl v4 " if any(is_bfcl(summary) for summary in facts.scores.values()) else ""
    load = f"toolpolicy eval CONFIG {bfcl}--set eval.checkpoint={facts.name if whole else f'PATH/TO/{facts.name}'}"
    lines = [f"# {facts.name}", "", what, "", "Score it with the config it was trained with:", "", "```", load, "```"]
    for name, summary in sorted(facts.scores.items()):
        lines += ["", *score_lines(name, summary)]
    if facts.config_text is not None:
        lines += ["", "## The run's config", "", "```yaml", facts.config_text.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def is_bfcl(summary: Mapping[str, Any]) -> bool:
    """A BFCL summary (`toolpolicy eval --bfcl`) names its scored model `model`; a task evaluation's names it `checkpoint`."""
    return "model" in summary


def score_lines(name: str, summary: Mapping[str, Any]) -> list[str]:
    """An evaluation summary as markdown: BFCL's per-category accuracy (with its groups), or
    a task evaluation's accuracy, calls and pass^k."""
    if is_bfcl(summary):
        rows = [(category, row["n"], row["accuracy"]) for category, row in summary["by_category"].items()]
        lines = [
            f"## {name}: BFCL, the official checker's verdict (the run's `eval/{name}.json`)",
            "",
            "| category | entries | accuracy |",
            "|---|---|---|",
            *(f"| {category} | {n} | {accuracy:.1%} |" for category, n, accuracy in [*rows, ("all", summary["n"], summary["accuracy"])]),
        ]
        groups = {group: score for group, score in (summary.get("groups") or {}).items() if score is not None}
        return lines + ([""] + [f"- {group}: {score:.1%}" for group, score in groups.items()] if groups else [])
    passes = ", ".join(f"pass^{k} {rate:.1%}" for k, rate in (summary.get("pass_hat_k") or {}).items())
    return [
        f"## {name}: task evaluation (the run's `eval/{name}.json`)",
        "",
        f"- episodes: {summary['n']}, accuracy {summary['accuracy']:.1%}, tool calls {summary['tool_calls_per_episode']:.2f} an episode",
        *([f"- {passes}"] if passes else []),
    ]


def card_facts(source: Path, exported: Path, name: str, dtype: str, merged: bool) -> CardFacts:
    """What the card says about `exported`, the model `source` (a run folder or a model
    folder) resolved to: a run's config and its evaluations whose model is `exported`."""
    adapter = adapter_config(exported) if is_adapter(exported) else None
    run = source if exported != source else None
    config = run / "config.yaml" if run is not None else None
    return CardFacts(
        name=name,
        source=str(exported),
        dtype=dtype,
        adapter=adapter,
        merged=merged,
        config_text=config.read_text(encoding="utf-8") if config is not None and config.is_file() else None,
        scores=evaluations_of(run, exported) if run is not None else {},
    )


def evaluations_of(run: Path, model: Path) -> dict[str, dict[str, Any]]:
    """The run's eval/<name>.json summaries whose scored model is `model` (see `is_bfcl`); a
    file that is not a JSON object raises RunFileError naming it."""
    found = {}
    for path in sorted((run / "eval").glob("*.json")):
        summary = read_eval(path)
        scored = summary.get("model" if is_bfcl(summary) else "checkpoint")
        if scored is not None and Path(scored).resolve() == model.resolve():
            found[path.stem] = summary
    return found
