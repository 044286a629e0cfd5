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

The model is the config's endpoint (`endpoint_url`) or local checkpoint; it gets
one assistant turn per entry. Scores: `match_calls` (BFCL's AST rules) per entry,
accuracy overall and per category, and the mean ToolRL-style reward components.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from toolpolicy.jsonl import read_objects
from toolpolicy.rewards.bfcl import Expected, Language, Match, call_reward, match_calls
from toolpolicy.rollout import GenRequest
from toolpolicy.rollout.chat_endpoint import ChatClient, Endpoint, decode_reply
from toolpolicy.config import Config, ConfigError
from toolpolicy.build import episode_limits, hf_backend, load_policy_model
from toolpolicy.types import Message, ToolCall, ToolSpec

# BFCL writes Python type names in its schemas; models are shown JSON Schema.
_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "list": "array", "int": "integer", "bool": "boolean", "str": "string"}


class BfclFileError(ValueError):
    """An entry that cannot be scored; the message names the file and line."""


@dataclass(frozen=True)
class Entry:
    """One single-turn question, the functions it offers and what counts as right.

    `kind`: "ast" compares the calls with `expected` (none expected: no call is
    right); "relevance" passes with any call at all. `shown` is the function list
    as the model sees it, where it differs from the one the answers are checked
    against (BFCL shows Java and JavaScript parameters as strings).
    """

    id: str
    category: str
    messages: list[Message]
    functions: list[dict[str, Any]]
    expected: list[Expected]
    language: Language = "python"
    kind: Literal["ast", "relevance"] = "ast"
    shown: list[dict[str, Any]] | None = None

    def specs(self) -> list[ToolSpec]:
        """The tools as the model is offered them, with "." in names as "_" (what OpenAI-style names allow)."""
        return [
            ToolSpec(shown_name(f["name"]), f.get("description", ""), json_schema(f.get("parameters") or {}))
            for f in self.shown or self.functions
        ]

    def called(self, calls: list[ToolCall]) -> list[ToolCall]:
        """The calls with each shown name turned back into the function's own."""
        names = {shown_name(f["name"]): f["name"] for f in self.functions}
        return [ToolCall(names.get(call.name, call.name), call.arguments, call.id) for call in calls]

    def verdict(self, calls: list[ToolCall]) -> Match:
        """BFCL's verdict on the calls the model made (with the entry's own names)."""
        if self.kind == "relevance":
            return Match(bool(calls), () if calls else ("expected a call (relevant request), got none",))
        return match_calls(calls, self.functions, self.expected, self.language)

    def reward(self, calls: list[ToolCall], malformed: int) -> dict[str, float]:
        """ToolRL-style components; for relevance, any call earns the call parts."""
        if self.kind == "relevance":
            fmt, score = (1.0 if malformed == 0 else 0.0), float(bool(calls))
            return {"format": fmt, "tool_name": score, "param_names": score, "param_values": score, "total": (fmt + 3 * score) / 4}
        return call_reward(calls, malformed, self.functions, self.expected, self.language)


def shown_name(name: str) -> str:
    """A function name as the model is shown it: OpenAI-style names allow no ".", BFCL writes "_" for it."""
    return name.replace(".", "_")


def check_names(functions: list[dict[str, Any]], where: str) -> None:
    """Two functions whose shown names coincide ("a.b" and "a_b") could not be told apart in a call."""
    shown = [shown_name(f["name"]) for f in functions]
    clashes = sorted({name for name in shown if shown.count(name) > 1})
    if clashes:
        raise BfclFileError(f"{where}: functions shown as {clashes} differ only by '.' and '_'; rename one")


def json_schema(schema: Any) -> Any:
    """A BFCL parameter schema with its Python type names ("dict", "float") as JSON Schema's."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: json_schema(value) for key, value in schema.items()}
    if isinstance(out.get("type"), str):
        if out["type"] == "any":
            del out["type"]
        else:
            out["type"] = _JSON_TYPES.get(out["type"], out["type"])
    return out


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


def score_bfcl(
    cfg: Config,
    checkpoint: Path | None,
    entries: list[Entry],
    out_dir: Path,
    name: str = "bfcl",
    groups: Callable[[dict[str, dict[str, Any]]], dict[str, float | None]] | None = None,
) -> dict[str, Any]:
    """Run the model once per entry, match its calls, write eval/NAME.json and NAME_results.jsonl.

    `groups` turns the per-category rows into the benchmark's group scores (BFCL v4's), kept as "groups".
    """
    turns = _endpoint_turns(cfg, entries) if cfg.endpoint_url else _local_turns(cfg, checkpoint, entries)
    results = []
    for entry, (shown_calls, malformed, text) in zip(entries, turns):
        calls = entry.called(shown_calls)
        match = entry.verdict(calls)
        reward = entry.reward(calls, malformed)
        results.append(
            {
                "id": entry.id,
                "category": entry.category,
                "ok": match.ok,
                "problems": list(match.problems),
                "reward": reward,
                "calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
                "malformed": malformed,
                "text": text,
            }
        )
    summary = summarize_bfcl(results)
    summary["model"] = cfg.endpoint_model if cfg.endpoint_url else str(checkpoint)
    if groups is not None:
        summary["groups"] = groups(summary["by_category"])
    folder = out_dir / "eval"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(summary, indent=2))
    (folder / f"{name}_results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    return summary


def summarize_bfcl(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy overall and per category, and the mean reward components."""
    by_category: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_category.setdefault(result["category"], []).append(result)

    def rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
        keys = rows[0]["reward"].keys()
        return {
            "n": len(rows),
            "accuracy": sum(r["ok"] for r in rows) / len(rows),
            "reward": {k: sum(r["reward"][k] for r in rows) / len(rows) for k in keys},
        }

    return {**rates(results), "by_category": {c: rates(rows) for c, rows in sorted(by_category.items())}}


def format_bfcl(summary: dict[str, Any]) -> str:
    lines = [f"BFCL-style calls: {summary['model']}", f"{'category':<22}{'n':>5}{'accuracy':>10}{'reward':>8}"]
    for name, row in [*summary["by_category"].items(), ("all", summary)]:
        lines.append(f"{name:<22}{row['n']:>5}{row['accuracy'] * 100:>9.1f}%{row['reward']['total']:>8.2f}")
    for name, score in (summary.get("groups") or {}).items():
        lines.append(f"{name:<27}" + (f"{score * 100:>9.1f}%" if score is not None else f"{'-':>10}"))
    return "\n".join(lines)


def _endpoint_turns(cfg: Config, entries: list[Entry]) -> list[tuple[list[ToolCall], int, str]]:
    endpoint = Endpoint(cfg.endpoint_url, cfg.endpoint_model, cfg.endpoint_api_key_env, cfg.eval_temperature, cfg.endpoint_max_tokens)
    client = ChatClient(endpoint)
    out = []
    try:
        for entry in entries:
            wire = [{"role": m.role, "content": m.content} for m in entry.messages]
            reply = client.complete(wire, [spec.to_openai() for spec in entry.specs()])
            parsed, _ = decode_reply(reply.message, 0, episode_limits(cfg).max_call_chars)
            out.append((list(parsed.tool_calls), len(parsed.errors), parsed.content))
    finally:
        client.close()
    return out


def _local_turns(cfg: Config, checkpoint: Path | None, entries: list[Entry]) -> list[tuple[list[ToolCall], int, str]]:
    if checkpoint is None:
        raise ConfigError("no model to score: set eval_checkpoint or endpoint_url")
    policy = load_policy_model(cfg, checkpoint)
    template = policy.chat
    backend = hf_backend(policy, torch.Generator().manual_seed(cfg.eval_seed), cfg.eval_temperature)
    requests = [
        GenRequest(i, policy.encode(template.render_prompt(entry.messages, entry.specs())), cfg.max_turn_tokens)
        for i, entry in enumerate(entries)
    ]
    out = []
    for generation in backend.generate(requests):
        text = policy.decode(generation.ids)
        parsed = template.parse(text, episode_limits(cfg).max_call_chars)
        out.append((list(parsed.tool_calls), len(parsed.errors), parsed.content))
    return out
