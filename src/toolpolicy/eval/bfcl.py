"""`toolpolicy eval CONFIG --bfcl FILE`: single-turn function calling in BFCL's JSONL shape.

Each line is one entry:

    {"id": "simple_3", "question": [[{"role": "user", "content": "..."}]],
     "function": [{"name": ..., "description": ..., "parameters": {"type": "dict", ...}}],
     "ground_truth": [{"fn": {"param": [acceptable values]}}]}

`question` may also be a flat list of messages. `ground_truth` may instead come
from a separate answers file (`--answers`, lines of {"id", "ground_truth"}), as
BFCL ships them. An empty ground truth means no call should be made
(irrelevance). The category is the entry's "category" or its id up to the last
underscore ("parallel_multiple_2" -> "parallel_multiple").

The model is the config's endpoint (`eval.served_url`) or local checkpoint; it gets
one assistant turn per answer, and an entry gets `eval.samples` answers when they are
sampled (one when greedy). Scores: `match_calls` (BFCL's AST rules) per answer,
accuracy overall and per category, pass@k and pass^k with several answers an entry,
and the mean ToolRL-style reward components.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from toolpolicy.envs.bfcl.single_data import BfclFileError, Entry, check_names, shown_name
from toolpolicy.jsonl import read_objects
from toolpolicy.eval.metrics import pass_rates
from toolpolicy.rewards.bfcl import components, verdict
from toolpolicy.rollout import GenRequest, HFBackend
from toolpolicy.rollout.chat_endpoint import ChatClient, Endpoint, decode_reply
from toolpolicy.config import Config, ConfigError, EvalSection
from toolpolicy.build import episode_limits, inference_policy
from toolpolicy.rollout.catalog import build_backend
from toolpolicy.types import Message, ToolCall

__all__ = [  # Entry and its helpers are single_data's (the bfcl environment reads them too), named here for callers
    "BfclFileError", "Entry", "check_names", "first_per_category", "format_bfcl", "load_entries", "pass_groups", "score_bfcl",
    "shown_name", "summarize_bfcl",
]


def load_entries(path: str | Path, answers: str | Path | None = None) -> list[Entry]:
    """Entries of a BFCL-shaped file, with ground truth inline or from `answers`."""
    truth = {row["id"]: row.get("ground_truth") for row, _ in _rows(answers)} if answers else {}
    entries = []
    for row, where in _rows(path):
        entries.append(_entry(row, truth, where))
    if not entries:
        raise BfclFileError(f"{path}: no entries")
    return entries


def _rows(path: str | Path) -> list[tuple[dict[str, Any], str]]:
    path = Path(path)
    if not path.is_file():
        raise BfclFileError(f"{path}: no such file")
    rows = []
    for where, row in read_objects(path, BfclFileError):
        if not isinstance(row.get("id"), str):
            raise BfclFileError(f"{where}: each line must be a JSON object with a string 'id'")
        rows.append((row, where))
    return rows


def _entry(row: dict[str, Any], truth: dict[str, Any], where: str) -> Entry:
    question = row.get("question")
    if isinstance(question, list) and question and isinstance(question[0], list):
        question = question[0]  # BFCL: a list of turns; single-turn entries have one
    if not isinstance(question, list) or not all(isinstance(m, dict) and "role" in m for m in question):
        raise BfclFileError(f"{where}: 'question' must be a list of messages with 'role' and 'content'")
    functions = row.get("function")
    if not isinstance(functions, list) or not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in functions):
        raise BfclFileError(f"{where}: 'function' must be a list of function schemas with a 'name'")
    expected = truth.get(row["id"], row.get("ground_truth"))
    if expected is None:
        raise BfclFileError(f"{where}: no ground truth for {row['id']!r} (inline 'ground_truth' or --answers)")
    if not isinstance(expected, list) or not all(isinstance(e, dict) and len(e) == 1 for e in expected):
        raise BfclFileError(f"{where}: 'ground_truth' must be a list of {{function: {{parameter: [values]}}}}")
    check_names(functions, where)
    category = str(row.get("category") or row["id"].rsplit("_", 1)[0])
    messages = [Message(m["role"], str(m.get("content", ""))) for m in question]
    return Entry(row["id"], category, messages, functions, expected)


def first_per_category(entries: list[Entry], limit: int | None) -> list[Entry]:
    """The first `limit` entries of each category, in their order (every entry for None)."""
    taken: dict[str, int] = {}
    out = []
    for entry in entries:
        if limit is None or taken.get(entry.category, 0) < limit:
            taken[entry.category] = taken.get(entry.category, 0) + 1
            out.append(entry)
    return out


def score_bfcl(
    cfg: Config,
    checkpoint: Path | None,
    entries: list[Entry],
    out_dir: Path,
    name: str = "bfcl",
    groups: Callable[[dict[str, dict[str, Any]]], dict[str, float | None]] | None = None,
) -> dict[str, Any]:
    """Run the model on each entry (`answers_per_entry` times), match its calls, write
    eval/NAME.json and NAME_results.jsonl (a row an answer, with its "sample" index).

    `groups` turns the per-category rows into the benchmark's group scores (BFCL v4's), kept as
    "groups"; with several answers an entry, also those of each category's pass@k ("groups_pass").
    """
    samples = answers_per_entry(cfg.eval)
    asked = [(entry, sample) for entry in entries for sample in range(samples)]
    turns = _endpoint_turns(cfg, asked) if cfg.eval.served_url else _local_turns(cfg, checkpoint, asked)
    results = []
    for (entry, sample), (shown_calls, malformed, text) in zip(asked, turns):
        calls = entry.called(shown_calls)
        match = verdict(calls, **entry.scoring())
        reward = components(calls, malformed, **entry.scoring())
        results.append(
            {
                "id": entry.id,
                "category": entry.category,
                "sample": sample,
                "ok": match.ok,
                "problems": list(match.problems),
                "reward": reward,
                "calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
                "malformed": malformed,
                "text": text,
            }
        )
    summary = summarize_bfcl(results)
    summary["model"] = cfg.eval.served_model if cfg.eval.served_url else str(checkpoint)
    if groups is not None:
        summary["groups"] = groups(summary["by_category"])
        if samples > 1:
            summary["groups_pass"] = pass_groups(summary["by_category"], groups)
    folder = out_dir / "eval"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(summary, indent=2))
    (folder / f"{name}_results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    return summary


def pass_groups(
    by_category: dict[str, dict[str, Any]], groups: Callable[[dict[str, dict[str, Any]]], dict[str, float | None]]
) -> dict[str, dict[str, float | None]]:
    """The benchmark's group scores of each category's pass@k in place of its accuracy, per k,
    from rows of each category's entry count ("n") and `pass_rates` ("pass")."""
    ks = [k for k in next(iter(by_category.values()))["pass"] if k.startswith("pass@")]
    return {k: groups({c: {**row, "accuracy": row["pass"][k]} for c, row in by_category.items()}) for k in ks}


def answers_per_entry(settings: EvalSection) -> int:
    """`eval.samples` answers an entry when they are sampled; greedy (`eval.temperature` 0)
    gives the same answer every time, so one."""
    return settings.samples if settings.temperature > 0 else 1


def summarize_bfcl(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per category and overall: entries, answers an entry, accuracy (the mean over all answers:
    pass@1) and the mean reward components; with several answers an entry, pass@k and pass^k
    for k up to their number (`pass_rates`)."""
    by_category: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_category.setdefault(result["category"], []).append(result)

    def rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
        keys = rows[0]["reward"].keys()
        right: dict[str, int] = {}
        for r in rows:
            right[r["id"]] = right.get(r["id"], 0) + bool(r["ok"])
        samples = len(rows) // len(right)
        out = {
            "n": len(right),
            "samples": samples,
            "accuracy": sum(r["ok"] for r in rows) / len(rows),
            "reward": {k: sum(r["reward"][k] for r in rows) / len(rows) for k in keys},
        }
        return out | ({"pass": pass_rates(list(right.values()), samples)} if samples > 1 else {})

    return {**rates(results), "by_category": {c: rates(rows) for c, rows in sorted(by_category.items())}}


def format_bfcl(summary: dict[str, Any], trained_on: tuple[str, ...] = ()) -> str:
    """The summary as a table; with `trained_on`, a column saying which categories are those
    (a training split's) and which are held out, and a line saying what that means. With
    several answers an entry, accuracy is their mean, and columns pass@N and pass^N follow."""

    def split(name: str) -> str:
        if not trained_on or name == "all":
            return ""
        return "  train split" if name in trained_on else "  held out"

    def percent(value: float | None, width: int) -> str:
        return f"{value * 100:>{width - 1}.1f}%" if value is not None else f"{'-':>{width}}"

    n = summary.get("samples", 1)
    many = [f"pass@{n}", f"pass^{n}"] if n > 1 else []
    header = f"{'category':<22}{'n':>5}{'accuracy':>10}{'reward':>8}" + "".join(f"{k:>9}" for k in many)
    lines = [f"BFCL-style calls: {summary['model']}" + (f" ({n} sampled answers an entry)" if n > 1 else ""),
             header + ("  split" if trained_on else "")]
    for name, row in [*summary["by_category"].items(), ("all", summary)]:
        passed = "".join(percent(row["pass"][k], 9) for k in many)
        lines.append(f"{name:<22}{row['n']:>5}{percent(row['accuracy'], 10)}{row['reward']['total']:>8.2f}{passed}{split(name)}")
    best = (summary.get("groups_pass") or {}).get(f"pass@{n}", {})
    for name, score in (summary.get("groups") or {}).items():
        lines.append(f"{name:<27}{percent(score, 10)}" + (f"{'':>8}{percent(best.get(name), 9)}" if many else ""))
    if any(name in trained_on for name in summary["by_category"]):
        lines.append("train split: what env bfcl trains on (docs/bfcl.md); a model trained there is scored on its own training data")
    return "\n".join(lines)


def _endpoint_turns(cfg: Config, asked: list[tuple[Entry, int]]) -> list[tuple[list[ToolCall], int, str]]:
    """The served model's turn for each (entry, sample), one request each."""
    served = cfg.eval
    endpoint = Endpoint(served.served_url, served.served_model, served.served_api_key_env, served.temperature, served.served_max_tokens)
    client = ChatClient(endpoint)
    out = []
    try:
        for entry, _ in tqdm(asked, desc="bfcl", unit="answer"):
            wire = [{"role": m.role, "content": m.content} for m in entry.messages]
            reply = client.complete(wire, [spec.to_openai() for spec in entry.specs()])
            parsed, _ = decode_reply(reply.message, 0, episode_limits(cfg.rollout).max_call_chars)
            out.append((list(parsed.tool_calls), len(parsed.errors), parsed.content))
    finally:
        client.close()
    return out


def _local_turns(cfg: Config, checkpoint: Path | None, asked: list[tuple[Entry, int]]) -> list[tuple[list[ToolCall], int, str]]:
    """The model's one turn for each (entry, sample), sampled by the config's backend: hf in
    batches that fit its cache, vllm (or a rollout server) in chunks it schedules itself.
    Greedy (eval.temperature 0) gives the same turns on either but for float rounding;
    sampled, each answer draws from its own seed where the backend takes one (hf): sample s
    of an entry from `entry_seed(eval.seed + s, entry)`, so sample 0 is the one answer a run
    of one sample an entry gives."""
    if checkpoint is None:
        raise ConfigError("no model to score: set eval.checkpoint or eval.served_url")
    policy = inference_policy(cfg.model, checkpoint)
    template = policy.chat
    backend = build_backend(cfg.backend, cfg.model, cfg.run.threads, policy, torch.Generator().manual_seed(cfg.eval.seed), cfg.eval.temperature)
    requests = [
        GenRequest(
            i, policy.encode(template.render_prompt(entry.messages, entry.specs())), cfg.rollout.max_turn_tokens,
            entry_seed(cfg.eval.seed + sample, entry.id) if backend.capabilities.request_seeds else None,
        )
        for i, (entry, sample) in enumerate(asked)
    ]
    chunks = backend.batches(requests) if isinstance(backend, HFBackend) else _chunks(len(requests), ENGINE_CHUNK)
    out = []
    try:
        with tqdm(total=len(requests), desc="bfcl", unit="answer") as bar:
            for chunk in chunks:
                for generation in backend.generate([requests[i] for i in chunk]):
                    text = policy.decode(generation.ids)
                    parsed = template.parse(text, episode_limits(cfg.rollout).max_call_chars)
                    out.append((list(parsed.tool_calls), len(parsed.errors), parsed.content))
                backend.forget()  # one turn each: nothing is continued
                bar.update(len(chunk))
    finally:
        backend.close()
    return out


ENGINE_CHUNK = 64
"""Entries handed to a vLLM engine at once: enough to keep its batch full, few enough for
the progress bar to move."""


def _chunks(count: int, size: int) -> list[list[int]]:
    return [list(range(start, min(start + size, count))) for start in range(0, count, size)]


def entry_seed(seed: int, entry_id: str) -> int:
    """The seed of an entry's own sampling stream: its answer depends on the eval seed and the
    entry alone, not on which entries (categories, --limit) or batches it runs with."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{entry_id}".encode()).digest()[:8], "little") % 2**63
