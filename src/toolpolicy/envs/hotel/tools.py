"""The hotel desk's tools, bound to one episode's database copy.

The tools do what they are asked and nothing more: none of them enforces the
policy (who may read what, the 48-hour rule, the refund cap). The gate does,
from the facts the read tools record in the ledger. That split is the point:
with the gate off a model can break the rules, and the database check and the
violation counters see that it did. Impossible operations (an unknown booking,
a room that is taken, a date that is not a date) raise ToolError, which the ToolSet
turns into ordinary tool errors, the model's fault; any other exception is a bug of
ours and ends the episode as an infrastructure error.

Facts recorded, for the policy's conditions (examples/policies/hotel.yaml):
    verified_guest: "G12"                 after `verify` succeeds
    guest_bookings: ["B307", "B311"]      that guest's bookings, also from `verify`
    booking_B307: {guest, status, hours, insured, paid, refunded, first_hours, least_hours,
                   reschedules}           from `bookings`, `read` and every write on it
The booking facts describe the booking's whole history in the database, not just its
present: `first_hours` is the time to the check-in it had before it was first moved,
`least_hours` the least time to any check-in it has had, `reschedules` how often it was
moved, `refunded` every refund so far. A policy that read only the present could be
walked around in steps (move a late booking out, then cancel it for free).

Dates are typed at the boundary: `reschedule` declares `format: date`, which the gate
asserts as strict YYYY-MM-DD, and parses them with the same function (`plain_date`), so
the date a policy condition compares and the date written to the database are the same.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from toolpolicy.envs.hotel.database import hours_until, nights, room_is_free
from toolpolicy.gate.schema import plain_date
from toolpolicy.tools import Tool, ToolError, ToolSet, tool
from toolpolicy.types import ToolResult


def booking_facts(connection: sqlite3.Connection, booking_id: str) -> dict[str, Any]:
    """What the policy needs to know about one booking, as plain JSON for the ledger.

    KeyError for an unknown booking: the tools check the id first (`need_booking`), so
    reaching it from a tool is a bug, reported as infra rather than blamed on the model."""
    row = connection.execute(
        "SELECT guest_id, status, check_in, insured, "
        "(SELECT COALESCE(SUM(amount), 0) FROM payments WHERE booking_id = b.id), "
        "(SELECT COALESCE(SUM(amount), 0) FROM refunds WHERE booking_id = b.id), "
        "(SELECT old_check_in FROM reschedules WHERE booking_id = b.id ORDER BY id LIMIT 1), "
        "(SELECT MIN(old_check_in) FROM reschedules WHERE booking_id = b.id), "
        "(SELECT COUNT(*) FROM reschedules WHERE booking_id = b.id) FROM bookings b WHERE id = ?",
        (booking_id,),
    ).fetchone()
    if row is None:
        raise KeyError(f"no booking {booking_id}")
    guest, status, check_in, insured, paid, refunded, first, earliest, moves = row
    return {"guest": guest, "status": status, "hours": hours_until(check_in), "insured": bool(insured),
            "paid": paid, "refunded": refunded, "first_hours": hours_until(first or check_in),
            "least_hours": hours_until(min(earliest or check_in, check_in)), "reschedules": moves}


def booking_line(connection: sqlite3.Connection, booking_id: str) -> str:
    """One booking as the model reads it, e.g. "B307 confirmed, 2 nights, in 219h, paid 240, refunded 0,
    no insurance" ("in 219h": hours from now to check-in). Dates are left out: no rule needs them and
    every digit is a token for the embedded model."""
    check_in, check_out = connection.execute(
        "SELECT check_in, check_out FROM bookings WHERE id = ?", (booking_id,)
    ).fetchone()
    f = booking_facts(connection, booking_id)
    insurance = "insured" if f["insured"] else "no insurance"
    return (f"{booking_id} {f['status']}, {nights(check_in, check_out)} nights, in {f['hours']}h, "
            f"paid {f['paid']}, refunded {f['refunded']}, {insurance}")


def _date(text: str) -> str:
    """`text` if it is a date written YYYY-MM-DD, the one spelling the gate lets through
    (`format: date`); ToolError otherwise, so the tool never reads a date the gate did not."""
    if plain_date(text) is None:
        raise ToolError(f"{text!r} is not a date like 2025-06-10")
    return text


DATE_ARGUMENTS = {"reschedule": ("start", "end")}
"""Arguments declared `format: date` in the tools' schemas."""


SQLITE_INTEGERS = range(-(2**63), 2**63)
"""What an INTEGER column holds; a refund outside it is the model's bad number, not a crash of ours."""

# The tools that change the database; the rest only read it.
WRITES = frozenset({"cancel", "reschedule", "refund", "message", "handoff"})


def make_tools(connection: sqlite3.Connection) -> ToolSet:
    """The nine desk tools working on `connection`. Writes commit at once.

    Each episode binds fresh functions to its own copy, reusing the specs and argument
    models derived once (`_described`): deriving them is 3 ms, binding is microseconds."""
    described = _described()
    return ToolSet(dataclasses.replace(described[fn.__name__], fn=fn) for fn in desk_functions(connection))


@lru_cache(maxsize=1)
def _described() -> dict[str, Tool]:
    """Every desk tool's spec and argument model, from the functions' hints and docstrings,
    with the date arguments marked `format: date` for the gate's schema check."""
    return {fn.__name__: _dated(tool(effect="write" if fn.__name__ in WRITES else "read")(fn))
            for fn in desk_functions(None)}


def _dated(described: Tool) -> Tool:
    names = DATE_ARGUMENTS.get(described.name, ())
    if not names:
        return described
    parameters = dict(described.spec.parameters)
    parameters["properties"] = {name: {**schema, "format": "date"} if name in names else schema
                                for name, schema in parameters["properties"].items()}
    return dataclasses.replace(described, spec=dataclasses.replace(described.spec, parameters=parameters))


def desk_functions(connection: sqlite3.Connection | None) -> list[Callable[..., Any]]:
    """The desk's plain functions bound to `connection`, in the order the model sees them.

    Names are single words (lookup, not find_guest): the embedded tokenizer splits at
    every '_', and a tool's name and argument names are paid for in every call."""
    db = connection

    def recorded(text: str, *booking_ids: str, **facts: Any) -> ToolResult:
        facts.update({f"booking_{b}": booking_facts(db, b) for b in booking_ids})
        return ToolResult(text, facts=facts)

    def need_booking(booking_id: str) -> None:
        if db.execute("SELECT 1 FROM bookings WHERE id = ?", (booking_id,)).fetchone() is None:
            raise ToolError(f"no booking {booking_id}")

    def owned(guest: str) -> list[str]:
        return [b for (b,) in db.execute("SELECT id FROM bookings WHERE guest_id = ? ORDER BY id", (guest,))]

    def lookup(surname: str) -> str:
        """Find guest ids by surname.

        Args:
            surname: The guest's last name.
        """
        rows = db.execute("SELECT id, first_name, last_name FROM guests WHERE lower(last_name) = lower(?) ORDER BY id",
                          (surname.strip(),)).fetchall()
        return "; ".join(" ".join(r) for r in rows) or f"no guest named {surname}"

    def verify(guest: str, surname: str, year: int) -> ToolResult:
        """Verify a guest's identity.

        Args:
            guest: Guest id, e.g. G12.
            surname: Last name the guest gave.
            year: Birth year the guest gave.
        """
        row = db.execute("SELECT last_name, birth_year FROM guests WHERE id = ?", (guest,)).fetchone()
        if row is None or row[0].lower() != surname.strip().lower() or row[1] != year:
            return ToolResult("not verified: details do not match")
        return ToolResult(f"verified {guest}", facts={"verified_guest": guest, "guest_bookings": owned(guest)})

    def bookings(guest: str) -> ToolResult:
        """List a guest's bookings.

        Args:
            guest: Guest id.
        """
        ids = owned(guest)
        return recorded("\n".join(booking_line(db, b) for b in ids) or "no bookings", *ids)

    def read(booking: str) -> ToolResult:
        """Read a booking.

        Args:
            booking: Booking id, e.g. B307.
        """
        need_booking(booking)
        return recorded(booking_line(db, booking), booking)

    def cancel(booking: str) -> ToolResult:
        """Cancel a booking; refunds the rest.

        Args:
            booking: Booking id.
        """
        need_booking(booking)
        facts = booking_facts(db, booking)
        left = facts["paid"] - facts["refunded"]
        db.execute("UPDATE bookings SET status = 'cancelled' WHERE id = ?", (booking,))
        if left > 0:
            db.execute("INSERT INTO refunds (booking_id, amount) VALUES (?, ?)", (booking, left))
        db.commit()
        return recorded(f"cancelled {booking}, refunded {left}", booking)

    def reschedule(booking: str, start: str, end: str) -> ToolResult:
        """Move a booking to new dates.

        Args:
            booking: Booking id.
            start: New check-in date, YYYY-MM-DD.
            end: New check-out date, YYYY-MM-DD.
        """
        need_booking(booking)
        start, end = _date(start), _date(end)
        if nights(start, end) < 1:
            raise ToolError("end must be after start")
        room, rate = db.execute(
            "SELECT r.id, r.rate FROM bookings b JOIN rooms r ON r.id = b.room_id WHERE b.id = ?", (booking,)
        ).fetchone()
        if not room_is_free(db, room, start, end, besides=booking):
            raise ToolError(f"room {room} is taken on those dates")
        total = rate * nights(start, end)
        db.execute("INSERT INTO reschedules (booking_id, old_check_in, old_check_out, new_check_in, new_check_out) "
                   "SELECT id, check_in, check_out, ?, ? FROM bookings WHERE id = ?", (start, end, booking))
        db.execute("UPDATE bookings SET check_in = ?, check_out = ?, total = ? WHERE id = ?",
                   (start, end, total, booking))
        db.commit()
        return recorded(f"moved {booking}, total {total}", booking)

    def refund(booking: str, amount: int) -> ToolResult:
        """Refund an amount.

        Args:
            booking: Booking id.
            amount: Amount to refund.
        """
        need_booking(booking)
        if amount not in SQLITE_INTEGERS:
            raise ToolError(f"amount {amount} is too large")
        db.execute("INSERT INTO refunds (booking_id, amount) VALUES (?, ?)", (booking, amount))
        db.commit()
        return recorded(f"refunded {amount} on {booking}", booking)

    def message(guest: str, text: str) -> str:
        """Message the guest.

        Args:
            guest: Guest id.
            text: The message.
        """
        if db.execute("SELECT 1 FROM guests WHERE id = ?", (guest,)).fetchone() is None:
            raise ToolError(f"no guest {guest}")
        db.execute("INSERT INTO messages (guest_id, text) VALUES (?, ?)", (guest, text))
        db.commit()
        return f"sent to {guest}"

    def handoff(guest: str, summary: str) -> str:
        """Hand over to a human.

        Args:
            guest: Guest id.
            summary: What the guest needs.
        """
        db.execute("INSERT INTO handoffs (guest_id, summary) VALUES (?, ?)", (guest, summary))
        db.commit()
        return "handed over"

    return [lookup, verify, bookings, read, cancel, reschedule, refund, message, handoff]
