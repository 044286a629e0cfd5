"""The episode ledger: what the gate remembers between calls of one episode.

Conditions read it as `state` (facts tools record, e.g. `user_verified`), `counts`
(calls that ran, per tool), `denials` (calls the gate denied, per tool), `denied_before`
(whether this very call, same tool and arguments, was denied earlier) and `history`
(the most recent HISTORY_WINDOW calls with their outcomes) and `session` (the running
totals a policy declares in `session:`, gate/session.py: kept as calls are admitted, one
number per tally, key and window slot). Limits read the calls that ran and the calls
denied, per tool and in all, and the runs of consecutive errors.

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
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from toolpolicy.gate.digest import args_digest, canonical_json
from toolpolicy.gate.session import Tally, TallyState, TallyUnknown, session_view, share, slot_of
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
"""Distinct tool names `counts` and `denials` keep apart; calls to further names are counted
together under OTHER_TOOLS, so the maps stay small. Only real tools get there (a call to a
name no tool has is counted under OTHER_TOOLS from the start, `refuse_unknown`). A full table
fails closed: a name it does not hold is read as having the count of OTHER_TOOLS, which holds
every call of every name it left out (`calls_of`, `denials_of`, `seen_by`)."""
OTHER_TOOLS = "?"
MAX_TOOL_NAME_CHARS = 128
"""The longest tool name the gate reads: MCP's own bound (the 2025-11-25 specification, Tools:
"Tool names SHOULD be between 1 and 128 characters in length (inclusive)"). A longer name is
no tool's; it is denied as unknown and kept in the ledger and the audit log only cut short."""


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

    A call the gate admits is counted in `counts` when it is admitted (`reserve`), before
    it runs, so calls admitted together cannot all pass a `max_calls` that only some of them
    fit; `record` then adds its outcome without counting it again, and `release` takes back a
    call that never reached its tool. `admitting` is held by `admit` from the decision to the
    reservation, so two threads admitting on one ledger see each other's calls.
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
        self._reserved: dict[str, int] = {}  # counted key -> admitted calls whose outcome is not recorded yet
        self.admitting = threading.Lock()
        self._start_tallies()
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
        self.history.append({"name": clipped_name(call.name), "args": args, "outcome": outcome})
        if outcome == "denied":
            self.total_attempts += 1
            _count(self.denials, call.name)
            self.total_denials += 1
            self._denied.add(call_digest(call.name, call.arguments))
            return
        key = _key(self.counts, call.name)
        if self._reserved.get(key, 0) > 0:  # counted when it was admitted
            self._reserved[key] -= 1
        else:
            self.total_attempts += 1
            _count(self.counts, call.name)
            self.total_calls += 1
            self._tally(call)
        if outcome == "ok":
            self.consecutive_errors[call.name] = 0
            self.consecutive_errors["*"] = 0
        else:
            self.consecutive_errors[call.name] = self.consecutive_errors.get(call.name, 0) + 1
            self.consecutive_errors["*"] = self.consecutive_errors.get("*", 0) + 1

    def reserve(self, call: ToolCall) -> None:
        """Count `call` as one that runs, now that the gate admitted it and before it runs: its
        place in `counts` and `max_calls` is held whatever happens to it later (a result that
        never comes, a client that cancels). Its outcome follows with `record`."""
        key = _key(self.counts, call.name)
        _count(self.counts, call.name)
        self.total_calls += 1
        self.total_attempts += 1
        self._reserved[key] = self._reserved.get(key, 0) + 1
        self._tally(call)

    def release(self, call: ToolCall) -> None:
        """Take back the reservation of an admitted call that never reached its tool (nothing
        ran, so it is not counted). A call that was sent must be recorded instead, never released."""
        key = _key(self.counts, call.name)
        if self._reserved.get(key, 0) <= 0:
            raise ValueError(f"release: no admitted call of {str(call.name)[:MAX_TOOL_NAME_CHARS]!r} awaits its outcome")
        self._reserved[key] -= 1
        self.counts[key] -= 1
        self.total_calls -= 1
        self.total_attempts -= 1

    def refuse_unknown(self, call: ToolCall) -> None:
        """Record a denied call to a name no tool has. It counts toward the denials of all tools
        together and under OTHER_TOOLS, never under its own name: invented names cannot fill the
        tables (and so switch off a tool's counts), nor a huge name enter them."""
        self.history.append({"name": clipped_name(call.name), "args": {}, "outcome": "denied"})
        self.total_attempts += 1
        self.total_denials += 1
        self.denials[OTHER_TOOLS] = self.denials.get(OTHER_TOOLS, 0) + 1

    def calls_of(self, name: str) -> int:
        """The calls of `name` that count toward its `max_calls` (see MAX_TOOL_NAMES)."""
        return _used(self.counts, name)

    def denials_of(self, name: str) -> int:
        """The denied calls of `name` that count toward its `max_denials` (see MAX_TOOL_NAMES)."""
        return _used(self.denials, name)

    def seen_by(self, table: Mapping[str, int], name: str) -> Mapping[str, int]:
        """`table` (counts or denials) as a condition deciding on `name` reads it: when the table
        is full and does not hold `name`, with `name` given the count of OTHER_TOOLS."""
        if name in table or OTHER_TOOLS not in table or len(table) < MAX_TOOL_NAMES:
            return table
        return {**table, name: table[OTHER_TOOLS]}

    def state(self) -> dict[str, Any]:
        """Everything the ledger holds, as plain JSON (`Ledger.from_state` reads it back)."""
        return {
            "facts": plain_copy(self._facts), "facts_problem": self.facts_problem, "counts": dict(self.counts),
            "denials": dict(self.denials), "consecutive_errors": dict(self.consecutive_errors),
            "history": [plain_copy(entry) for entry in self.history], "total_calls": self.total_calls,
            "total_attempts": self.total_attempts, "total_denials": self.total_denials,
            "denied": sorted(digest.hex() for digest in self._denied),
            **self._tallies_state(),
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
        ledger._restore_tallies(state)
        return ledger

    def recount(self, name: str, decision: str, arguments_digest: str, unknown: bool = False) -> None:
        """Count a decision read back from an audit log, where only the tool, the effect and
        the arguments' digest are kept: an allowed call as one that ran (whether it then
        succeeded is not known), a denied one as denied, with its digest for `denied_before`;
        `unknown`: a call to a name no tool had, as `refuse_unknown` counts it."""
        if unknown:
            self.total_attempts += 1
            self.total_denials += 1
            self.denials[OTHER_TOOLS] = self.denials.get(OTHER_TOOLS, 0) + 1
            return
        self.total_attempts += 1
        if decision == "allow":
            self._tally_blind(name)
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

    # ---- session tallies (`session.<name>`, gate/session.py): their state, next to the counts

    def _start_tallies(self) -> None:
        self._tallies: tuple[Tally, ...] = ()
        self.tallies: dict[str, TallyState] = {}
        """Tally name -> its state (gate/session.py), once a gate has bound its policy's tallies."""
        self.tally_clock = 0
        """Calls that ran (admitted to run), all tools together: the slots of windows in calls."""
        self.now: Callable[[], float] = time.time
        """The clock of windows in seconds (a test or a replay may set its own)."""
        self._blind: set[str] = set()
        """Tools with calls counted whose arguments are not known (`recount`), before any tally
        was bound: a tally bound later that counts one of them is unknown. OTHER_TOOLS: any."""

    def bind_tallies(self, tallies: tuple[Tally, ...]) -> None:
        """Keep the state of `tallies` (a policy's `session:`), called by the gate before it
        decides. A tally this ledger does not hold yet starts at zero, or unknown if a call it
        would have counted ran already (the ledger cannot know what that call added)."""
        if tallies is self._tallies:
            return
        for tally in tallies:
            state = self.tallies.get(tally.name)
            blind = bool(self._blind) and (tally.tools is None or OTHER_TOOLS in self._blind
                                           or not self._blind.isdisjoint(tally.tools))
            if state is not None and state.fingerprint == tally.fingerprint:
                if blind and not state.unknown:
                    state.unknown, state.amounts = f"session.{tally.name}: counted from a log that keeps no arguments", {}
                continue
            ran = self.total_calls > 0 if tally.tools is None else any(
                self.counts.get(name, 0) for name in (*tally.tools, OTHER_TOOLS))
            unknown = f"session.{tally.name}: calls it counts ran before this ledger kept it" if ran else ""
            self.tallies[tally.name] = TallyState(tally.fingerprint, unknown)
        self._tallies = tallies

    def session_view(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any] | str:
        """`session` for a condition deciding on a call of `name` with `arguments`: each bound
        tally's total with this call's share; or why there is none (a tally is unknown)."""
        try:
            return session_view(self._tallies, self.tallies, name, arguments, self.tally_clock, self.now())
        except TallyUnknown as unknown:
            return str(unknown)

    def _tally(self, call: ToolCall) -> None:
        """Add an admitted call's share to every bound tally that counts it."""
        self.tally_clock += 1
        for tally in self._tallies:
            state = self.tallies[tally.name]
            if state.unknown or not tally.applies_to(call.name):
                continue
            try:
                if not isinstance(call.arguments, dict) or plain_json_problem(call.arguments) is not None:
                    raise TallyUnknown(f"session.{tally.name}: a call's arguments were not plain JSON")
                own = share(tally, call.name, call.arguments)
            except TallyUnknown as unknown:
                state.unknown, state.amounts = str(unknown), {}
                continue
            if own is not None:
                state.add(tally, own[0], own[1], slot_of(tally, self.tally_clock, self.now()))

    def _tally_blind(self, name: str) -> None:
        """A call of `name` ran whose arguments are not known (read back from an audit log):
        every bound tally that would count it is unknown from now on."""
        self.tally_clock += 1
        if not self._tallies:
            self._blind.add(name if len(self._blind) < MAX_TOOL_NAMES else OTHER_TOOLS)
        for tally in self._tallies:
            state = self.tallies[tally.name]
            if tally.applies_to(name) and not state.unknown:
                state.unknown, state.amounts = f"session.{tally.name}: counted from a log that keeps no arguments", {}

    def _tallies_state(self) -> dict[str, Any]:
        return {"tallies": {name: state.state() for name, state in self.tallies.items()}, "tally_clock": self.tally_clock,
                "tallies_blind": sorted(self._blind)}

    def _restore_tallies(self, state: Mapping[str, Any]) -> None:
        """The tallies `_tallies_state` wrote; a state written before tallies existed has none
        (a tally bound later is then unknown if its calls ran: `bind_tallies`)."""
        self.tallies = {str(name): TallyState.from_state(saved) for name, saved in dict(state.get("tallies", {})).items()}
        self.tally_clock = int(state.get("tally_clock", 0))
        self._blind = {str(name) for name in state.get("tallies_blind", [])}


def _key(table: Mapping[str, int], name: str) -> str:
    """The key `name` is counted under in `table`: its own, or OTHER_TOOLS once the table is full."""
    return name if name in table or len(table) < MAX_TOOL_NAMES else OTHER_TOOLS


def _count(table: dict[str, int], name: str) -> None:
    key = _key(table, name)
    table[key] = table.get(key, 0) + 1


def _used(table: Mapping[str, int], name: str) -> int:
    """`name`'s count in `table`; for a name a full table left out, the count of OTHER_TOOLS
    (every call it left out, so at least this name's own): a full table denies early, never late."""
    used = table.get(name)
    if used is not None:
        return used
    return table.get(OTHER_TOOLS, 0) if len(table) >= MAX_TOOL_NAMES else 0


def clipped_name(name: object) -> str:
    """A tool name as the ledger and the audit log keep it: whole up to MAX_TOOL_NAME_CHARS; a
    longer one (no tool's) cut there and marked with its length and the SHA-256 of the whole."""
    text = name if isinstance(name, str) else repr(name)
    if len(text) <= MAX_TOOL_NAME_CHARS:
        return text
    whole = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{text[:MAX_TOOL_NAME_CHARS]}...[{len(text):,} characters, sha256 {whole}]"


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
