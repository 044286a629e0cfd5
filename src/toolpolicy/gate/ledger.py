"""The episode ledger: what the gate remembers between calls of one episode.

Conditions read it as `state` (facts tools record, e.g. `user_verified`), `history`
(every earlier call with its outcome) and `counts` (calls that ran, per tool). Limits
read `counts` and the runs of consecutive errors. The gate only reads the ledger; the
caller records each call's outcome after acting on the decision, so a ledger can be
replayed from a log and `Gate.decide` stays free of side effects on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from toolpolicy.types import ToolCall

Outcome = Literal["ok", "error", "denied"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "error", "denied")

# CEL values are converted recursively by the Rust binding, which segfaults on nesting
# around 10,000 levels; JSON decoded from model text never needs more than a few.
MAX_NESTING = 64


@dataclass
class Ledger:
    """Per-episode state. Make a new one for every episode.

    facts: set by tools (or the environment), read by conditions as `state`.
    history: one entry per recorded call: {"name", "args", "outcome"}, oldest first.
    counts: tool name -> calls that ran (outcome "ok" or "error"); denied calls are in
        history but not counted, so a denial does not use up a tool's budget.
    """

    facts: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    # tool name (and "*" for all tools together) -> errors since that tool last succeeded
    consecutive_errors: dict[str, int] = field(default_factory=dict)

    def record(self, call: ToolCall, outcome: Outcome) -> None:
        """Remember that `call` was denied, or ran and succeeded ("ok") or failed ("error").

        Arguments that are not plain JSON (only possible for calls built in code) are
        stored as {} with a marker, so that no later condition trips over them.
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        plain = plain_json_problem(call.arguments) is None and isinstance(call.arguments, dict)
        args: dict[str, Any] = dict(call.arguments) if plain else {"_unrepresentable": True}
        self.history.append({"name": call.name, "args": args, "outcome": outcome})
        if outcome == "denied":
            return
        self.counts[call.name] = self.counts.get(call.name, 0) + 1
        if outcome == "ok":
            self.consecutive_errors[call.name] = 0
            self.consecutive_errors["*"] = 0
        else:
            self.consecutive_errors[call.name] = self.consecutive_errors.get(call.name, 0) + 1
            self.consecutive_errors["*"] = self.consecutive_errors.get("*", 0) + 1

    @property
    def total_calls(self) -> int:
        return sum(self.counts.values())


def plain_json_problem(value: Any, max_nesting: int = MAX_NESTING) -> str | None:
    """None if `value` is plain JSON data (dict with str keys, list, str, int, float, bool,
    None) nested at most `max_nesting` deep; otherwise what is wrong, for the denial.

    Iterative, so hostile nesting cannot exhaust the Python stack either.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > max_nesting:
            return f"arguments are nested more than {max_nesting} levels deep"
        if item is None or isinstance(item, (bool, int, float)):
            continue
        if isinstance(item, str):
            if not _is_utf8(item):
                return "arguments contain a string that is not valid Unicode (a lone surrogate)"
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"arguments contain an object key that is a {type(key).__name__}, not a string"
                if not _is_utf8(key):
                    return "arguments contain an object key that is not valid Unicode"
                stack.append((child, depth + 1))
            continue
        if isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)
            continue
        return f"arguments contain a {type(item).__name__}, which is not JSON"
    return None


def _is_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
