"""The SQL tool: queries on a SQLite database, read-only unless asked otherwise.

Read-only is enforced three times over, because each layer alone has a gap: the file
is opened with SQLite's `mode=ro` URI (no write reaches the file), `PRAGMA query_only`
rejects every statement that would write, and an authorizer denies ATTACH, DETACH and
PRAGMA writes, so a query cannot open a second database read-write or switch
query_only back off. In either mode a progress handler stops a query after a budget
of virtual-machine steps (a recursive CTE that never ends), one call runs one
statement, and results are cut to a number of rows that says how many more there were.

The tool's description lists the tables and their columns, so the model knows the
schema without spending a call on it.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from toolpolicy.tools.decorator import Tool, ToolError, tool

MAX_QUERY_CHARS = 4000
PROGRESS_EVERY = 1000  # SQLite VM instructions between checks of the budget

_ALWAYS_DENIED = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH}
# Pragmas whose argument names a table or index to describe; any other pragma with an
# argument sets something (PRAGMA journal_mode = ..., query_only = 0) and is denied.
_DESCRIBING_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list", "table_list"}
)


class SqlDatabase:
    """One SQLite file behind a lock (the connection is shared across threads)."""

    def __init__(
        self,
        path: str | Path,
        read_only: bool = True,
        max_rows: int = 50,
        max_steps: int = 5_000_000,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such SQLite database")
        self.read_only = read_only
        self.max_rows = max_rows
        self.max_steps = max_steps
        mode = "ro" if read_only else "rw"
        self._connection = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode={mode}", uri=True, check_same_thread=False, isolation_level=None
        )
        if read_only:
            self._connection.execute("PRAGMA query_only = ON")
        self._connection.set_authorizer(self._authorize)
        self._lock = threading.Lock()
        self._steps = 0

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> SqlDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
        if action in _ALWAYS_DENIED:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_PRAGMA and arg2 is not None and (arg1 or "").lower() not in _DESCRIBING_PRAGMAS:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _over_budget(self) -> int:
        self._steps += PROGRESS_EVERY
        return 1 if self._steps > self.max_steps else 0

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]], int]:
        """Run one statement: (column names, the first max_rows rows, how many rows were cut)."""
        with self._lock:
            self._steps = 0
            self._connection.set_progress_handler(self._over_budget, PROGRESS_EVERY)
            try:
                cursor = self._connection.execute(sql)
                columns = [d[0] for d in cursor.description or ()]
                rows = cursor.fetchmany(self.max_rows)
                more = sum(1 for _ in cursor) if len(rows) == self.max_rows else 0
            finally:
                self._connection.set_progress_handler(None, 0)
            return columns, rows, more

    def schema_text(self) -> str:
        """'table(col type, ...)' per table, for the tool description."""
        with self._lock:
            tables = self._connection.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            ).fetchall()
            lines = []
            for (table,) in tables:
                columns = self._connection.execute("SELECT name, type FROM pragma_table_info(?)", (table,)).fetchall()
                lines.append(f"{table}({', '.join(f'{name} {kind}'.strip() for name, kind in columns)})")
        return "; ".join(lines)

    def tool(self, name: str = "sql") -> Tool:
        """The tool the model calls: `sql(query)`, its description naming the tables."""
        database = self
        access = "read-only" if self.read_only else "read and write"
        description = f"Run one SQL statement on a SQLite database ({access}). Tables: {self.schema_text()}."

        def sql(query: str) -> str:
            """Run one SQL statement.

            Args:
                query: One SQLite statement, e.g. "SELECT name FROM guests WHERE id = 3".
            """
            if len(query) > MAX_QUERY_CHARS:
                raise ToolError(f"the query is {len(query)} characters; keep it under {MAX_QUERY_CHARS}")
            return database.run(query)

        return tool(name=name, description=description)(sql)

    def run(self, sql: str) -> str:
        """A query's result as the model reads it; SQL errors raise ToolError with SQLite's reason.

        Every sqlite3 error is taken as the query's (the model's): the database is a local
        file opened at construction, so syntax, a missing table, a denied write and the
        step budget are what go wrong. A failing disk would be misfiled as the model's;
        telling it apart by SQLite's message is not worth its fragility here."""
        try:
            columns, rows, more = self.query(sql)
        except sqlite3.ProgrammingError as error:  # e.g. two statements in one call
            raise ToolError(f"{error}") from None
        except sqlite3.DatabaseError as error:
            raise ToolError(explain(error, self)) from None
        except UnicodeEncodeError:  # a lone surrogate; the gate denies these before they get here
            raise ToolError("the query is not valid Unicode") from None
        return format_rows(columns, rows, more)


def explain(error: sqlite3.DatabaseError, database: SqlDatabase) -> str:
    """SQLite's error in words the model can act on."""
    message = str(error)
    if "interrupted" in message:
        return f"the query was stopped after {database.max_steps:,} steps; add a LIMIT or a narrower WHERE"
    if "not authorized" in message or "authorization denied" in message:
        return "not allowed: ATTACH, DETACH and PRAGMA settings are blocked" + (
            "; this database is read-only, only SELECT queries are allowed" if database.read_only else ""
        )
    if "readonly" in message:
        return f"{message}: this database is read-only; only SELECT queries are allowed"
    return message


def format_rows(columns: list[str], rows: list[tuple[Any, ...]], more: int) -> str:
    """A small pipe table; a statement without rows says what it did."""
    if not columns:
        return "OK (the statement returned no rows)."
    lines = [" | ".join(columns)]
    lines += [" | ".join("NULL" if value is None else str(value) for value in row) for row in rows]
    if not rows:
        lines.append("(no rows)")
    if more:
        lines.append(f"... {more} more rows not shown; narrow the query or add LIMIT")
    return "\n".join(lines)
