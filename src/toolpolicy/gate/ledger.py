"""The episode ledger: what the gate remembers between calls of one episode.

Conditions read it as `state` (facts tools record, e.g. `user_verified`), `counts`
(calls that ran, per tool), `denials` (calls the gate denied, per tool), `denied_before`
(whether this very call, same tool and arguments, was denied earlier) and `history`
(the most recent HISTORY_WINDOW calls with their outcomes). Limits read the calls that
ran and the calls denied, per tool and in all, and the runs of consecutive errors.

Every summary is kept up to date as calls are recorded, so a decision costs the same
after 20,000 calls as after one: nothing the gate reads grows with the episode except
the facts tools choose to record and the set of denied-call digests (16 bytes each,
looked up, never scanned). A condition that needs to know about the whole episode
reads a summary; `history` is a window, not the episode.

The gate only reads the ledger; the caller records each call's outcome after acting
on the decision, so a ledger can be replayed from a log and `Gate.decide` stays free of
side effects on it.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from toolpolicy.gate.digest import args_digest, canonical_json
from toolpolicy.types import ToolCall

Outcome = Literal["ok", "error", "denied"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "error", "denied")

# CEL values are converted recursively by the Rust binding, which segfaults on nesting
# around 10,000 levels; JSON decoded from model text never needs more than a few.
MAX_NESTING = 64

HISTORY_WINDOW = 16
"""How many recent calls `history` shows conditions. Converting one entry to CEL costs about
10 us, so the window is what bounds the price of a condition that reads `history`."""

MAX_TOOL_NAMES = 256
"""Distinct tool names `counts` and `denials` keep apart; calls to further names (only a model
inventing tools gets there) are counted together under OTHER_TOOLS, so the maps stay small."""
OTHER_TOOLS = "?"


class Ledger:
    """Per-episode state. Make a new one for every episode.

    facts: set by tools (or the environment) through `learn`, read by conditions as
        `state`. A read-only view: a fact enters through `learn`, which checks it once.
    counts: tool name -> calls that ran (outcome "ok" or "error").
    denials: tool name -> calls the gate denied. `max_calls` limits counts (what ran),
        `max_denials` limits denials, so that a model cannot probe the policy without
        end by sending calls it expects to be refused either.
    consecutive_errors: tool name (and "*" for all tools together) -> errors since that
        tool last succeeded. A denial neither adds to nor resets a run of errors.
    history: the last HISTORY_WINDOW recorded calls, oldest first: {"name", "args", "outcome"}.
    facts_problem: why a fact offered to `learn` was not plain JSON (None when all were).
        Every condition that reads `state` then fails, so the gate fails closed.

    What enters the ledger is checked and copied as it enters (facts in `learn`, arguments
    in `record`), so a decision converts the ledger to CEL without checking it again.
    """

    def __init__(self, facts: Mapping[str, Any] | None = None) -> None:
        self._facts: dict[str, Any] = {}
        self.facts_problem: str | None = None
        self.counts: dict[str, int] = {}
        self.denials: dict[str, int] = {}
        self.consecutive_errors: dict[str, int] = {}
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_WINDOW)
        self.total_calls = 0
        """Calls that ran, all tools together."""
        self.total_attempts = 0
        """Calls recorded, ran or denied, all tools together."""
        self.total_denials = 0
        """Calls denied, all tools together."""
        self._denied: set[bytes] = set()
        self.learn(facts or {})

    @property
    def facts(self) -> Mapping[str, Any]:
        return MappingProxyType(self._facts)

    def learn(self, facts: Mapping[str, Any]) -> None:
        """Add or replace facts (e.g. {"user_verified": True}). Each value is checked to be
        plain JSON and copied, so a caller changing its own object later changes nothing here."""
        for key, value in facts.items():
            problem = f"a fact key is a {type(key).__name__}, not a string" if not isinstance(key, str) else None
            problem = problem or plain_json_problem(value)
            if problem is not None:
                self.facts_problem = self.facts_problem or f"fact {str(key)[:60]!r}: {problem.replace('arguments', 'values')}"
                continue
            self._facts[key] = plain_copy(value)

    def record(self, call: ToolCall, outcome: Outcome) -> None:
        """Remember that `call` was denied, or ran and succeeded ("ok") or failed ("error").

        Arguments that are not plain JSON (only possible for calls built in code) are
        stored as {} with a marker, so that no later condition trips over them.
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        plain = isinstance(call.arguments, dict) and plain_json_problem(call.arguments) is None
        args: dict[str, Any] = plain_copy(call.arguments) if plain else {"_unrepresentable": True}
        self.history.append({"name": call.name, "args": args, "outcome": outcome})
        self.total_attempts += 1
        if outcome == "denied":
            _count(self.denials, call.name)
            self.total_denials += 1
            self._denied.add(call_digest(call.name, call.arguments))
            return
        _count(self.counts, call.name)
        self.total_calls += 1
        if outcome == "ok":
            self.consecutive_errors[call.name] = 0
            self.consecutive_errors["*"] = 0
        else:
            self.consecutive_errors[call.name] = self.consecutive_errors.get(call.name, 0) + 1
            self.consecutive_errors["*"] = self.consecutive_errors.get("*", 0) + 1

    def state(self) -> dict[str, Any]:
        """Everything the ledger holds, as plain JSON (`Ledger.from_state` reads it back)."""
        return {
            "facts": plain_copy(self._facts), "facts_problem": self.facts_problem, "counts": dict(self.counts),
            "denials": dict(self.denials), "consecutive_errors": dict(self.consecutive_errors),
            "history": [plain_copy(entry) for entry in self.history], "total_calls": self.total_calls,
            "total_attempts": self.total_attempts, "total_denials": self.total_denials,
            "denied": sorted(digest.hex() for digest in self._denied),
        }  # fmt: skip

    @staticmethod
    def from_state(state: Mapping[str, Any]) -> Ledger:
        """The ledger `state()` described (ValueError or KeyError on a state of another shape)."""
        ledger = Ledger(state["facts"])
        ledger.facts_problem = state["facts_problem"] or ledger.facts_problem
        ledger.counts, ledger.denials = dict(state["counts"]), dict(state["denials"])
        ledger.consecutive_errors = dict(state["consecutive_errors"])
        ledger.history.extend(plain_copy(entry) for entry in state["history"])
        ledger.total_calls, ledger.total_attempts = int(state["total_calls"]), int(state["total_attempts"])
        ledger.total_denials = int(state["total_denials"])
        ledger._denied = {bytes.fromhex(digest) for digest in state["denied"]}
        return ledger

    def recount(self, name: str, decision: str, arguments_digest: str) -> None:
        """Count a decision read back from an audit log, where only the tool, the effect and
        the arguments' digest are kept: an allowed call as one that ran (whether it then
        succeeded is not known), a denied one as denied, with its digest for `denied_before`."""
        self.total_attempts += 1
        if decision == "allow":
            _count(self.counts, name)
            self.total_calls += 1
            return
        _count(self.denials, name)
        self.total_denials += 1
        self._denied.add(_digest_of(name, arguments_digest))

    def attempts(self, name: str) -> int:
        """Calls of tool `name` recorded so far, ran or denied."""
        return self.counts.get(name, 0) + self.denials.get(name, 0)

    def denied_before(self, name: str, arguments: Any) -> bool:
        """Whether a call of `name` with these arguments was denied earlier this episode."""
        return bool(self._denied) and call_digest(name, arguments) in self._denied


def _count(table: dict[str, int], name: str) -> None:
    key = name if name in table or len(table) < MAX_TOOL_NAMES else OTHER_TOOLS
    table[key] = table.get(key, 0) + 1


def call_digest(name: str, arguments: Any) -> bytes:
    """16 bytes naming a call by tool and arguments: of the tool and the arguments' digest as
    the audit log keeps it (`args_digest`: canonical JSON, key order does not matter), so a
    ledger rebuilt from the log knows the same denied calls."""
    return _digest_of(name, args_digest(arguments))


def _digest_of(name: str, arguments_digest: str) -> bytes:
    return hashlib.blake2b(canonical_json([name, arguments_digest]).encode("ascii"), digest_size=16).digest()


_LEAF_TYPES = frozenset({int, float, bool, type(None)})


def plain_json_problem(value: Any, levels: int = MAX_NESTING) -> str | None:
    """None if `value` is plain JSON data (dict with str keys, list, str, int, float, bool,
    None) with at most `levels` levels of nesting below it; otherwise what is wrong, for the denial.

    The recursion stops at MAX_NESTING levels, so hostile nesting cannot exhaust the Python
    stack. It runs on every call's arguments before the rules, so the common cases come first,
    and leaves of exactly these types (an ASCII str, int, float, bool, None) are checked in
    their container's loop; anything else, a subclass included, takes the full check.
    """
    if isinstance(value, str):
        return None if _is_utf8(value) else "arguments contain a string that is not valid Unicode (a lone surrogate)"
    if value is None or isinstance(value, (bool, int, float)):
        return None
    if isinstance(value, dict):
        if levels <= 0 and value:
            return f"arguments are nested more than {MAX_NESTING} levels deep"
        for key, child in value.items():
            if type(key) is not str or not key.isascii():
                if not isinstance(key, str):
                    return f"arguments contain an object key that is a {type(key).__name__}, not a string"
                if not _is_utf8(key):
                    return "arguments contain an object key that is not valid Unicode"
            if type(child) in _LEAF_TYPES or (type(child) is str and child.isascii()):
                continue  # the common leaves, checked here without a call
            if (problem := plain_json_problem(child, levels - 1)) is not None:
                return problem
        return None
    if isinstance(value, (list, tuple, deque)):
        if levels <= 0 and value:
            return f"arguments are nested more than {MAX_NESTING} levels deep"
        for child in value:
            if type(child) in _LEAF_TYPES or (type(child) is str and child.isascii()):
                continue  # the common leaves, checked here without a call
            if (problem := plain_json_problem(child, levels - 1)) is not None:
                return problem
        return None
    return f"arguments contain a {type(value).__name__}, which is not JSON"


def plain_copy(value: Any) -> Any:
    """A copy of plain JSON data (see plain_json_problem), sharing nothing mutable with it."""
    if isinstance(value, dict):
        return {key: plain_copy(child) for key, child in value.items()}
    if isinstance(value, (list, tuple, deque)):
        return [plain_copy(child) for child in value]
    return value


def _is_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
