"""The hotel's SQLite database: schema, deterministic seed data, per-episode copies, a canonical hash.

Dates are relative to a fixed TODAY in the data, never the wall clock, so a task
built today scores the same next year. The clock stands at NOW_HOUR on TODAY and
every stay starts at CHECK_IN_HOUR, so a booking starting tomorrow is 27 hours away.

`canonical_hash` is what the reward compares: a run reaches the goal iff its final
database hashes like the reference run's. Free text the model writes (message
bodies, hand-over summaries) and auto-increment ids are left out of the hash, so
two runs that did the same things in other words hash the same.

`reschedules` logs every date change (the dates before and after). It is there for the
policy, not the reward: it lets the tools tell the gate the dates a booking had before
it was first moved and whether it was ever within the free-cancellation window, so that
moving a late booking out and then cancelling it is not a free cancellation. It is left
out of the hash: the bookings row already holds the outcome, and a run that reached the
goal dates in two moves reached the goal.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import sqlite3
from functools import lru_cache

TODAY = "2025-06-01"
NOW_HOUR = 12
CHECK_IN_HOUR = 15
FREE_CANCEL_HOURS = 48

SCHEMA = """
CREATE TABLE guests (
    id TEXT PRIMARY KEY, first_name TEXT NOT NULL, last_name TEXT NOT NULL, birth_year INTEGER NOT NULL);
CREATE TABLE rooms (id TEXT PRIMARY KEY, kind TEXT NOT NULL, rate INTEGER NOT NULL);
CREATE TABLE bookings (
    id TEXT PRIMARY KEY, guest_id TEXT NOT NULL REFERENCES guests, room_id TEXT NOT NULL REFERENCES rooms,
    check_in TEXT NOT NULL, check_out TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('confirmed', 'cancelled', 'checked_in')),
    insured INTEGER NOT NULL, total INTEGER NOT NULL);
CREATE TABLE payments (id TEXT PRIMARY KEY, booking_id TEXT NOT NULL REFERENCES bookings, amount INTEGER NOT NULL);
CREATE TABLE refunds (id INTEGER PRIMARY KEY, booking_id TEXT NOT NULL REFERENCES bookings, amount INTEGER NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY, guest_id TEXT NOT NULL REFERENCES guests, text TEXT NOT NULL);
CREATE TABLE handoffs (id INTEGER PRIMARY KEY, guest_id TEXT NOT NULL REFERENCES guests, summary TEXT NOT NULL);
CREATE TABLE reschedules (
    id INTEGER PRIMARY KEY, booking_id TEXT NOT NULL REFERENCES bookings,
    old_check_in TEXT NOT NULL, old_check_out TEXT NOT NULL, new_check_in TEXT NOT NULL, new_check_out TEXT NOT NULL);
"""

# The columns each table contributes to the canonical hash (None: all of them, in schema order).
# Tables not listed (reschedules) do not contribute.
HASHED_COLUMNS: dict[str, tuple[str, ...] | None] = {
    "guests": None,
    "rooms": None,
    "bookings": None,
    "payments": None,
    "refunds": ("booking_id", "amount"),
    "messages": ("guest_id",),
    "handoffs": ("guest_id",),
}

FIRST_NAMES = "Ana Ben Cara Dan Eva Finn Gia Hugo Ida Jon Kai Lea Max Nia Omar Pia Rui Sara Tom Uma".split()
LAST_NAMES = "Silva Brown Costa Dubois Evans Fischer Garcia Hansen Ito Jensen Khan Lopez Moreau Novak Olsen".split()
ROOM_KINDS = (("single", 80), ("double", 120), ("suite", 200))


def date_after(days: int) -> str:
    """TODAY plus `days`, as YYYY-MM-DD."""
    return (dt.date.fromisoformat(TODAY) + dt.timedelta(days=days)).isoformat()


def days_until(date: str) -> int:
    """Calendar days from TODAY to `date` (negative in the past)."""
    return (dt.date.fromisoformat(date) - dt.date.fromisoformat(TODAY)).days


def hours_until(check_in: str) -> int:
    """Whole hours from now (NOW_HOUR on TODAY) to check-in time on `check_in`."""
    return days_until(check_in) * 24 + CHECK_IN_HOUR - NOW_HOUR


def nights(check_in: str, check_out: str) -> int:
    return (dt.date.fromisoformat(check_out) - dt.date.fromisoformat(check_in)).days


def room_is_free(
    connection: sqlite3.Connection, room_id: str, check_in: str, check_out: str, besides: str = ""
) -> bool:
    """No live booking (other than `besides`) of `room_id` overlaps [check_in, check_out)."""
    clash = connection.execute(
        "SELECT 1 FROM bookings WHERE room_id = ? AND id != ? AND status != 'cancelled' "
        "AND check_in < ? AND check_out > ?",
        (room_id, besides, check_out, check_in),
    ).fetchone()
    return clash is None


def build_database(connection: sqlite3.Connection, seed: int = 0) -> None:
    """Fill an empty database with the same guests, rooms, bookings and payments for the same seed.

    About 60 guests with 1-3 bookings each: most start 2-30 days out (free to cancel),
    a fifth start within 48 hours (late), some are already checked in, some cancelled
    (and refunded in full), about a third are insured.
    """
    rng = random.Random(f"hotel-db/{seed}")
    connection.executescript(SCHEMA)
    rooms = []
    for number in range(1, 17):
        kind, rate = ROOM_KINDS[(number - 1) % 3]
        rooms.append((f"R{number}", kind, rate))
    connection.executemany("INSERT INTO rooms VALUES (?, ?, ?)", rooms)
    booking_number = 100
    names = rng.sample([(first, last) for first in FIRST_NAMES for last in LAST_NAMES], 60)  # no two alike
    for index, (first, last) in enumerate(names):
        guest_id = f"G{10 + index}"
        connection.execute("INSERT INTO guests VALUES (?, ?, ?, ?)", (guest_id, first, last, rng.randint(1950, 2004)))
        for _ in range(rng.choices((1, 2, 3), (0.4, 0.4, 0.2))[0]):
            when = rng.random()
            start = rng.randint(-2, 0) if when < 0.1 else rng.randint(0, 1) if when < 0.3 else rng.randint(2, 30)
            check_in, check_out = date_after(start), date_after(start + rng.randint(1, 4))
            free = [r for r in rng.sample(rooms, len(rooms)) if room_is_free(connection, r[0], check_in, check_out)]
            if not free:
                continue
            room_id, _, rate = free[0]
            status = "checked_in" if start < 0 or (start == 0 and when < 0.1) else "confirmed"
            if status == "confirmed" and rng.random() < 0.15:
                status = "cancelled"
            booking_number += rng.randint(1, 9)
            booking_id, total = f"B{booking_number}", rate * nights(check_in, check_out)
            connection.execute(
                "INSERT INTO bookings VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (booking_id, guest_id, room_id, check_in, check_out, status, int(rng.random() < 0.3), total),
            )
            connection.execute("INSERT INTO payments VALUES (?, ?, ?)", (f"P{booking_number}", booking_id, total))
            if status == "cancelled":
                connection.execute("INSERT INTO refunds (booking_id, amount) VALUES (?, ?)", (booking_id, total))
    connection.commit()


@lru_cache(maxsize=64)
def seed_database(seed: int = 0) -> sqlite3.Connection:
    """The pristine database for `seed`, built once per process and only ever copied from."""
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    build_database(connection, seed)
    return connection


def fresh_copy(seed: int = 0) -> sqlite3.Connection:
    """A private in-memory copy of the seed database for one episode (SQLite's backup API, ~1 ms)."""
    copy = sqlite3.connect(":memory:", check_same_thread=False)
    seed_database(seed).backup(copy)
    return copy


def canonical_hash(connection: sqlite3.Connection) -> str:
    """SHA-256 over every table's hashed columns, rows sorted: equal for equal content,
    whatever the insertion order, row ids or free text."""
    digest = hashlib.sha256()
    for table, columns in HASHED_COLUMNS.items():
        selected = "*" if columns is None else ", ".join(columns)
        rows = sorted(connection.execute(f"SELECT {selected} FROM {table}").fetchall())
        digest.update(json.dumps([table, rows]).encode())
    return digest.hexdigest()
