"""Tasks generated from the seed database: what the guest asks, what a compliant desk does.

Every task carries a `plan`: the compliant desk's steps in order, each a tool call
({"call": {"name", "arguments"}}) or a message to the guest ({"say": text}; one
ending in "?" is a question the guest answers). The plan's calls are the task's
reference actions; the goal state is the hash of a fresh copy after replaying them,
computed once here and stored as `info["goal_hash"]`. `info["must_say"]` are the
facts the guest must be told (the refund amount, the new dates, the reason for a
refusal), checked in the assistant's messages.

Kinds, by category:
    feasible    cancel, change, change_declined (the guest says no when asked to
                confirm: no write), refund, handoff
    forbidden   cancel_late (<= 48 h, no insurance), refund_over (above what is left
                of the payment), change_cancelled: a polite refusal and no write
    ambiguous   which_booking: "cancel my booking" with two or more live bookings
    multi_step  change_and_message: confirm, move the dates, then message the guest
Independently, the guest gives their identity up front ("given"), only their name
("by_name": lookup first) or not at all ("asked": the desk asks).

Every TASKS_PER_DATABASE consecutive tasks share one database of about 60 guests,
with its own seed (`info["db_seed"]`), so the desk meets thousands of different
guests and has to copy each one's details from the conversation: with one fixed
guest list a small model learns the list by heart instead, and fails on any guest
it has not seen. Train and eval databases come from disjoint seeds (even and odd)
and different random streams, so eval never repeats a training guest or conversation.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

from toolpolicy.envs.hotel.database import (
    FREE_CANCEL_HOURS, TODAY, canonical_hash, date_after, days_until, fresh_copy, nights, room_is_free, seed_database,
)
from toolpolicy.envs.hotel.tools import booking_facts, make_tools
from toolpolicy.types import Task, ToolCall

IDENTITY_WEIGHTS = {"given": 5, "by_name": 2, "asked": 3}
TASKS_PER_DATABASE = 8
ASK_IDENTITY = "Your guest id, last name and birth year?"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"call": {"name": name, "arguments": arguments}}


def say(text: str) -> dict[str, Any]:
    return {"say": text}


def plan_calls(plan: list[dict[str, Any]]) -> list[ToolCall]:
    """The reference actions: the plan's tool calls, in order."""
    return [ToolCall(step["call"]["name"], dict(step["call"]["arguments"])) for step in plan if "call" in step]


def goal_hash(plan: list[dict[str, Any]], seed: int) -> str:
    """The canonical hash of a fresh copy after the plan's calls; every call must succeed."""
    connection = fresh_copy(seed)
    tools = make_tools(connection)
    for reference in plan_calls(plan):
        result = tools.call(reference)
        if not result.ok:
            raise AssertionError(f"reference call {reference} failed: {result.content}")
    digest = canonical_hash(connection)
    connection.close()
    return digest


def _bookings(db: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = db.execute("SELECT b.id, b.guest_id, b.check_in, b.check_out, b.room_id, r.rate FROM bookings b "
                      "JOIN rooms r ON r.id = b.room_id ORDER BY b.id").fetchall()
    out = []
    for booking_id, guest, check_in, check_out, room, rate in rows:
        out.append({"id": booking_id, "guest": guest, "check_in": check_in, "check_out": check_out, "room": room,
                    "rate": rate, **booking_facts(db, booking_id)})
    return out


def _refundable(b: dict[str, Any]) -> bool:
    return b["status"] == "confirmed" and (b["hours"] > FREE_CANCEL_HOURS or b["insured"])


class Draft(NamedTuple):
    """What a kind of task contributes: the guest's request, the desk's steps after
    verification, the facts the guest must be told, and extra info for the guest and expert."""

    request: str
    steps: list[dict[str, Any]]
    must_say: list[str]
    extra: dict[str, Any] = {}


def _new_dates(db: sqlite3.Connection, b: dict[str, Any], rng: random.Random) -> tuple[str, str]:
    """Later dates of the same length on which `b`'s room is free; LookupError if there are none."""
    length = nights(b["check_in"], b["check_out"])
    start = max(1, days_until(b["check_in"]))
    for shift in rng.sample(range(1, 9), 8):
        check_in, check_out = date_after(start + shift), date_after(start + shift + length)
        if room_is_free(db, b["room"], check_in, check_out, besides=b["id"]):
            return check_in, check_out
    raise LookupError(f"no free dates for {b['id']}")


def _cancel(b, db, rng) -> Draft:
    left = b["paid"] - b["refunded"]
    return Draft(f"Please cancel {b['id']}.", [call("read", booking=b["id"]), call("cancel", booking=b["id"]),
                                               say(f"{b['id']} is cancelled and {left} refunded.")], [str(left)])


def _cancel_late(b, db, rng) -> Draft:
    refusal = f"Sorry, {b['id']} starts within 48 hours and is not insured, so I cannot cancel it."
    return Draft(f"Please cancel {b['id']}.", [call("read", booking=b["id"]), say(refusal)], ["48"])


def _change(b, db, rng, confirm: bool = True, message: bool = False) -> Draft:
    bid = b["id"]
    start, end = _new_dates(db, b, rng)
    request = f"Please move {bid} to {start}..{end}" + (" and message me." if message else ".")
    ask = say(f"Move {bid} to {start}..{end}, total {b['rate'] * nights(start, end)}. Confirm?")
    extra = {"new_dates": [start, end], "confirm": confirm}
    if not confirm:
        return Draft(request, [call("read", booking=bid), ask, say(f"OK, {bid} stays as it is.")], [], extra)
    steps = [call("read", booking=bid), ask, call("reschedule", booking=bid, start=start, end=end)]
    if message:
        steps.append(call("message", guest=b["guest"], text=f"{bid} moved to {start}..{end}."))
    steps.append(say(f"Done, {bid} is moved" + ("; message sent." if message else ".")))
    return Draft(request, steps, [start, end], extra)


def _change_cancelled(b, db, rng) -> Draft:
    start, end = _new_dates(db, b, rng)
    return Draft(f"Please move {b['id']} to {start}..{end}.", [
        call("read", booking=b["id"]), say(f"Sorry, {b['id']} is cancelled, so I cannot change it.")],
        ["cancelled"], {"new_dates": [start, end]})


def _refund(b, db, rng) -> Draft:
    amount = rng.choice([a for a in (10, 20, 30, 40, 50) if a <= b["paid"] - b["refunded"]])
    return Draft(f"I was overcharged on {b['id']}. Please refund {amount}.", [
        call("read", booking=b["id"]), call("refund", booking=b["id"], amount=amount),
        say(f"Refunded {amount} on {b['id']}.")], [str(amount)], {"amount": amount})


def _refund_over(b, db, rng) -> Draft:
    left = b["paid"] - b["refunded"]
    amount = left + rng.choice((20, 50, 100))
    return Draft(f"Please refund {amount} on {b['id']}.", [
        call("read", booking=b["id"]), say(f"Sorry, I can refund at most {left} on {b['id']}.")],
        [str(left)], {"amount": amount})


def _handoff(b, db, rng) -> Draft:
    return Draft(f"I want to dispute a charge on {b['id']} with a manager.", [
        call("handoff", guest=b["guest"], summary=f"dispute on {b['id']}"), say("I have passed you to a colleague.")],
        ["colleague"])


def _which_booking(b, db, rng) -> Draft:
    live = [o for (o,) in db.execute("SELECT id FROM bookings WHERE guest_id = ? AND status = 'confirmed' ORDER BY id",
                                     (b["guest"],))]
    left = b["paid"] - b["refunded"]
    return Draft("Please cancel my booking.", [
        call("bookings", guest=b["guest"]), say(f"Which booking: {' or '.join(live)}?"),
        call("cancel", booking=b["id"]), say(f"{b['id']} is cancelled and {left} refunded.")], [str(left)])


class Kind(NamedTuple):
    """One kind of task: its category, its weight in the mix, which bookings fit it
    (given the booking and how many confirmed bookings its guest has), and its draft."""

    category: str
    weight: int
    fits: Callable[[dict[str, Any], int], bool]
    draft: Callable[..., Draft]


KINDS: dict[str, Kind] = {
    "cancel": Kind("feasible", 3, lambda b, live: _refundable(b), _cancel),
    "change": Kind("feasible", 2, lambda b, live: b["status"] == "confirmed", _change),
    "change_declined": Kind("feasible", 1, lambda b, live: b["status"] == "confirmed",
                            lambda b, db, rng: _change(b, db, rng, confirm=False)),
    "refund": Kind("feasible", 2, lambda b, live: b["status"] != "cancelled" and b["paid"] - b["refunded"] >= 20,
                   _refund),
    "handoff": Kind("feasible", 1, lambda b, live: True, _handoff),
    "cancel_late": Kind("forbidden", 2, lambda b, live: b["status"] == "confirmed" and not _refundable(b),
                        _cancel_late),
    "refund_over": Kind("forbidden", 2, lambda b, live: b["status"] != "cancelled", _refund_over),
    "change_cancelled": Kind("forbidden", 2, lambda b, live: b["status"] == "cancelled", _change_cancelled),
    "which_booking": Kind("ambiguous", 3, lambda b, live: _refundable(b) and live >= 2, _which_booking),
    "change_and_message": Kind("multi_step", 3, lambda b, live: b["status"] == "confirmed",
                               lambda b, db, rng: _change(b, db, rng, message=True)),
}
CATEGORY = {name: kind.category for name, kind in KINDS.items()}


def database_seed(family: int, split: str, seed: int, block: int) -> int:
    """The seed of the database behind block `block` of a task list: even for train, odd for eval."""
    digest = hashlib.sha256(f"hotel-tasks/{family}/{split}/{seed}/{block}".encode()).digest()
    return int.from_bytes(digest[:6], "big") * 2 + (split == "eval")


def make_tasks(split: str, n: int, seed: int, db_seed: int = 0) -> list[Task]:
    """`n` tasks of `split` ("train" or "eval"), the same for the same arguments; `db_seed`
    picks the family of databases the tasks' own database seeds are drawn from."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    rng = random.Random(f"hotel/{split}/{seed}")
    out: list[Task] = []
    for block in range(-(-n // TASKS_PER_DATABASE)):
        database = database_seed(db_seed, split, seed, block)
        for prompt, info in _drafts_on(database, min(TASKS_PER_DATABASE, n - len(out)), rng):
            out.append(Task(f"hotel-{split}-{seed}-{len(out)}", prompt, "", info))
    return out


def _drafts_on(database: int, n: int, rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """The prompts and infos of `n` tasks on the guests and bookings of database `database`, drawn with `rng`."""
    db = seed_database(database)
    guests = {g: (first, last, year) for g, first, last, year in db.execute("SELECT * FROM guests ORDER BY id")}
    bookings = _bookings(db)
    live = Counter(b["guest"] for b in bookings if b["status"] == "confirmed")
    fitting = {name: [b for b in bookings if kind.fits(b, live[b["guest"]])] for name, kind in KINDS.items()}
    names = [name for name in KINDS if fitting[name]]
    out: list[tuple[str, dict[str, Any]]] = []
    while len(out) < n:
        name = rng.choices(names, [KINDS[k].weight for k in names])[0]
        b = rng.choice(fitting[name])
        try:
            draft = KINDS[name].draft(b, db, rng)
        except LookupError:  # no free dates to move to: draw again
            continue
        first, last, year = guests[b["guest"]]
        identity = rng.choices(list(IDENTITY_WEIGHTS), list(IDENTITY_WEIGHTS.values()))[0]
        opening = {"given": f"{b['guest']}, {last}, born {year}. ", "by_name": f"I'm {first} {last}, born {year}. ",
                   "asked": ""}[identity]
        verify = call("verify", guest=b["guest"], surname=last, year=year)
        head = {"given": [verify], "by_name": [call("lookup", surname=last), verify],
                "asked": [say(ASK_IDENTITY), verify]}[identity]
        plan = head + draft.steps
        info = {
            "category": KINDS[name].category, "kind": name, "identity": identity, "guest": b["guest"],
            "first_name": first, "last_name": last, "birth_year": year, "booking": b["id"], "confirm": True,
            "namesakes": [g for g, (_, other, _) in guests.items() if other == last and g != b["guest"]],
            "plan": plan, "must_say": draft.must_say, "goal_hash": goal_hash(plan, database), "db_seed": database,
            "min_tool_calls": len(plan_calls(plan)), "today": TODAY, **draft.extra,
        }
        out.append((opening + draft.request, info))
    return out
