"""Running totals over a session's calls: what `session.<name>` reads in a condition.

A per-call rule caps one call: `withdraw_funds(amount)` at most 10,000. Twelve withdrawals
of 9,999 pass it. A policy that means "at most 20,000 per session" declares a tally, a
running total the ledger keeps as calls are admitted, and a rule over it:

    session:
      withdrawn:                        # read in conditions as session.withdrawn
        tools: [withdraw_funds]         # the calls that add to it ("*": every tool)
        sum: double(args.amount)        # CEL over tool and args: what each call adds (omitted: 1)
        when: args.currency == 'EUR'    # optional CEL: which of those calls count
        per: args.account               # optional CEL string: a total per value (a map)
        within: {calls: 10}             # optional window: the last 10 calls that ran, of any tool,
                                        #   or {seconds: 86400}; omitted: the whole session
    rules:
      - id: withdrawals-per-session
        effect: forbid
        tools: [withdraw_funds]
        when: session.withdrawn > 20000.0
        reason: withdrawals may not exceed 20,000 in one session.

What a condition reads is the total *with this call*: the calls admitted before it (in the
window) and this call's own share, if it is one the tally counts. So `session.withdrawn >
20000.0` refuses exactly the call that would take the total over 20,000, and a limit holds
however the sum is split (many small calls, one large one, a restart between them, since
the ledger's state carries the totals: `Ledger.state` / `Ledger.from_state`).

- A call counts when the gate admits it (`Ledger.reserve`) or, for a ledger fed by `record`
  alone, when it is recorded as ran: calls that ran count whether they succeeded or failed
  (a failed withdrawal may still have moved money), denied calls never do, and a call taken
  back before it reached its tool (`Ledger.release`) still counts: a cap errs on refusing.
- A share below zero adds nothing: a negative amount cannot buy room under a cap.
- A count is a CEL int; a sum a double (compare it with a double: `> 20000.0`).
- The state is bounded: one number per window slot and key. A session-wide tally keeps one
  number (per key); `{calls: N}` at most N entries; `{seconds: S}` one per sixtieth of S. A
  time window counts whole slots, so it may remember a call up to S/60 longer than S: a cap
  over a time window can refuse early, never late.
- A tally that cannot be kept exactly is *unknown*, and every condition that reads `session`
  fails, so a forbid reading it denies: a call whose share does not evaluate (an amount that
  is no number), more keys than `max_keys` (64 unless set, at most 1,024), calls that ran
  before the tally was bound to the ledger, or a ledger counted from an audit log (which
  keeps no arguments). A policy whose tallies change starts them on a fresh ledger.

The definitions are read and checked by gate/policy.py (`session:`); the ledger keeps their
state (gate/ledger.py); this module holds what is shared: the definition and the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import cel

from toolpolicy.gate.values import VALUE_FUNCTIONS

DEFAULT_MAX_KEYS = 64
MAX_KEYS = 1024
MAX_WINDOW_CALLS = 10_000
MAX_WINDOW_SECONDS = 10 * 366 * 86_400.0
TIME_SLOTS = 60
"""A time window is kept as this many slots: the cost of a cap per day is 60 numbers, not a list of calls."""


class TallyUnknown(Exception):
    """A tally that can no longer be kept exactly; the message says why."""


@dataclass(frozen=True)
class Tally:
    """One declared running total (see the module docstring).

    name: as conditions read it, `session.<name>`.
    tools: the tools whose calls add to it; None: every tool.
    when, sum, per: CEL sources over `tool` and `args` (None: always, 1, one total).
    calls, seconds: the window (0, 0: the whole session; only one is set).
    programs: the compiled (when, sum, per), None where not given.
    functions: the whole-value functions (gate/values.py) the expressions call.
    fingerprint: a digest of the definition, so a ledger's state is only ever read back
        under the definition that wrote it.
    """

    name: str
    tools: tuple[str, ...] | None
    when: str | None = None
    sum: str | None = None
    per: str | None = None
    calls: int = 0
    seconds: float = 0.0
    max_keys: int = DEFAULT_MAX_KEYS
    fingerprint: str = ""
    programs: tuple[Any, Any, Any] = field(default=(None, None, None), compare=False, repr=False)
    functions: frozenset[str] = frozenset()

    def applies_to(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools

    def slot_width(self) -> float:
        """Seconds per slot of a time window."""
        return self.seconds / TIME_SLOTS


def share(tally: Tally, tool: str, args: Mapping[str, Any]) -> tuple[str, float | int] | None:
    """What a call of `tool` with `args` adds to `tally`: (key, amount), or None when the tally
    does not count it. TallyUnknown when an expression fails or gives the wrong type.

    The key is "" without `per`. The amount is 1 without `sum`, else the sum's number, 0 if
    it is negative."""
    if not tally.applies_to(tool):
        return None
    when, amount, per = tally.programs
    if when is None and amount is None and per is None:
        return "", 1
    context = cel.Context(variables={"tool": tool, "args": dict(args)})
    for name in tally.functions:
        context.add_function(name, VALUE_FUNCTIONS[name])
    if when is not None:
        counted = _run(when, context, tally, "when")
        if counted is False:
            return None
        if counted is not True:
            raise TallyUnknown(f"session.{tally.name}: when gave a {type(counted).__name__}, not a boolean")
    key = ""
    if per is not None:
        key = _run(per, context, tally, "per")
        if not isinstance(key, str):
            raise TallyUnknown(f"session.{tally.name}: per gave a {type(key).__name__}, not a string")
    if amount is None:
        return key, 1
    value = _run(amount, context, tally, "sum")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TallyUnknown(f"session.{tally.name}: sum gave a {type(value).__name__}, not a finite number")
    return key, max(float(value), 0.0)


def _run(program: Any, context: Any, tally: Tally, part: str) -> Any:
    try:
        return program.execute(context)
    except Exception as error:  # a missing argument, a value that does not convert
        raise TallyUnknown(f"session.{tally.name}: {part} could not be evaluated ({type(error).__name__})") from None


class TallyState:
    """The ledger's state of one tally: amounts by (slot, key), pruned to the window.

    slot: 0 for a session-wide tally; the index of the call that ran (the ledger's count of
    calls admitted to run, `clock`) for a window in calls; the time slot (`time // width`)
    for a window in seconds. `unknown` holds why the tally is no longer exact ("" while it is).
    """

    __slots__ = ("amounts", "fingerprint", "unknown")

    def __init__(self, fingerprint: str, unknown: str = "") -> None:
        self.fingerprint = fingerprint
        self.unknown = unknown
        self.amounts: dict[tuple[int, str], float | int] = {}

    def add(self, tally: Tally, key: str, amount: float | int, slot: int) -> None:
        """Add `amount` under `key` in `slot`, then drop the slots the window has left behind."""
        if self.unknown:
            return
        place = (slot, key)
        self.amounts[place] = self.amounts.get(place, 0) + amount
        self.prune(_first_slot(tally, slot))
        if len({key for _, key in self.amounts}) > tally.max_keys:
            self.unknown = f"session.{tally.name} was given more than {tally.max_keys} different keys"
            self.amounts.clear()

    def prune(self, first: int) -> None:
        if first > 0 and any(slot < first for slot, _ in self.amounts):
            self.amounts = {place: amount for place, amount in self.amounts.items() if place[0] >= first}

    def totals(self, tally: Tally, slot: int) -> dict[str, float | int]:
        """Each key's total over the window that ends at `slot` (the slot this call would take)."""
        first = _first_slot(tally, slot)
        totals: dict[str, list[float | int]] = {}
        for (at, key), amount in self.amounts.items():
            if at >= first:
                totals.setdefault(key, []).append(amount)
        zero: float | int = 0 if tally.sum is None else 0.0
        return {key: (sum(parts) if tally.sum is None else math.fsum(parts)) if parts else zero
                for key, parts in totals.items()}

    def state(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "unknown": self.unknown,
                "amounts": [[slot, key, amount] for (slot, key), amount in self.amounts.items()]}

    @staticmethod
    def from_state(state: Mapping[str, Any]) -> TallyState:
        """The state `state()` described (ValueError, KeyError or TypeError on another shape)."""
        restored = TallyState(str(state["fingerprint"]), str(state["unknown"]))
        for slot, key, amount in state["amounts"]:
            if not isinstance(slot, int) or not isinstance(key, str) or isinstance(amount, bool) \
                    or not isinstance(amount, (int, float)):
                raise ValueError("a tally's amounts must be [slot, key, number]")
            restored.amounts[(slot, key)] = amount
        return restored


def _first_slot(tally: Tally, slot: int) -> int:
    """The oldest slot still inside the window that ends at `slot`."""
    if tally.calls:
        return slot - tally.calls + 1
    if tally.seconds:
        return slot - TIME_SLOTS
    return 0


def slot_of(tally: Tally, clock: int, now: float) -> int:
    """The slot a call takes: 0 (whole session), its index among the calls that ran (`clock`,
    this call included), or its time slot."""
    if tally.calls:
        return clock
    if tally.seconds:
        return int(now // tally.slot_width())
    return 0


def session_view(tallies: tuple[Tally, ...], states: Mapping[str, TallyState], tool: str, args: Mapping[str, Any],
                 clock: int, now: float) -> dict[str, Any]:
    """`session` as a condition on a call of `tool` with `args` reads it: each tally's total
    with this call's share, a number, or a map of key -> number for a tally with `per`.
    TallyUnknown when a tally is unknown or this call's share cannot be computed."""
    view: dict[str, Any] = {}
    for tally in tallies:
        state = states.get(tally.name)
        if state is None or state.fingerprint != tally.fingerprint:
            raise TallyUnknown(f"session.{tally.name} is not kept by this ledger")
        if state.unknown:
            raise TallyUnknown(state.unknown)
        slot = slot_of(tally, clock + 1, now)
        totals = state.totals(tally, slot)
        own = share(tally, tool, args)
        if own is not None:
            key, amount = own
            if key not in totals and len({kept for _, kept in state.amounts}) >= tally.max_keys:
                raise TallyUnknown(f"session.{tally.name} would hold more than {tally.max_keys} different keys")
            totals[key] = totals.get(key, 0) + amount
        if tally.per is None:
            view[tally.name] = totals.get("", 0 if tally.sum is None else 0.0)
        else:
            view[tally.name] = totals
    return view
