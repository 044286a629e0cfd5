"""The search tool (bm25s over a JSONL corpus) and the SQL tool (SQLite, read-only mode)."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from toolpolicy.tools import ToolSet
from toolpolicy.tools.search import CorpusError, SearchIndex, read_corpus
from toolpolicy.tools.sql import SqlDatabase
from toolpolicy.types import ToolCall

DOCS = [
    {"id": "canberra", "title": "Canberra", "text": "Canberra is the capital city of Australia."},
    {"id": "sydney", "title": "Sydney", "text": "Sydney is the largest city in Australia, known for its opera house."},
    {"id": "kiwi", "text": "The kiwi is a flightless bird native to New Zealand."},
    {"id": "everest", "text": "Mount Everest is the highest mountain above sea level. " * 20},
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n\n", encoding="utf-8")
    return path


def call(tools: ToolSet, name: str, **arguments):
    return tools.call(ToolCall(name, arguments))


def test_search_ranks_the_matching_document_first(corpus: Path) -> None:
    index = SearchIndex.from_jsonl(corpus)
    hits = index.search("capital of Australia", k=2)
    assert [h.document.id for h in hits] == ["canberra", "sydney"]
    assert hits[0].score > hits[1].score > 0
    assert index.search("flightless bird")[0].document.id == "kiwi"


def test_search_tool_output_is_numbered_and_cut_to_snippets(corpus: Path) -> None:
    tools = ToolSet([SearchIndex.from_jsonl(corpus).tool(snippet_chars=60)])
    result = call(tools, "search", query="highest mountain", k=1)
    assert result.ok
    assert result.content.startswith("[1] everest\nMount Everest is the highest mountain")
    assert result.content.endswith(" …") and len(result.content) < 100
    assert tools.specs()[0].parameters["required"] == ["query"]


def test_search_without_a_match_says_so(corpus: Path) -> None:
    tools = ToolSet([SearchIndex.from_jsonl(corpus).tool()])
    assert call(tools, "search", query="zebra quantum").content.startswith("No document matches")
    assert call(tools, "search", query="the of and").content.startswith("No document matches")  # stopwords only


def test_search_rejects_bad_arguments_as_observations(corpus: Path) -> None:
    tools = ToolSet([SearchIndex.from_jsonl(corpus).tool()])
    assert call(tools, "search", query="kiwi", k=50).error == "tool_error"
    assert call(tools, "search", query="x" * 600).error == "tool_error"
    assert call(tools, "search", k=2).error == "invalid_arguments"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": "a", "text": "x"}\nnot json\n', "corpus.jsonl:2: not valid JSON"),
        ('{"id": "a"}\n', "corpus.jsonl:1: field 'text' is missing"),
        ('["a", "b"]\n', "corpus.jsonl:1: expected a JSON object, got list"),
        ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "corpus.jsonl:2: duplicate document id 'a'"),
        ('{"id": "a", "text": "x", "title": 3}\n', "corpus.jsonl:1: field 'title' must be a string"),
        ("\n\n", "the corpus is empty"),
    ],
)
def test_bad_corpus_files_name_the_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError, match=message):
        read_corpus(path)


def test_missing_corpus_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="no such corpus file"):
        SearchIndex.from_jsonl(tmp_path / "absent.jsonl")


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "hotel.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE guests (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT)")
        connection.executemany(
            "INSERT INTO guests (name, city) VALUES (?, ?)", [(f"guest {i}", None if i % 2 else "Oslo") for i in range(80)]
        )
    connection.close()
    return path


def rows_in(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        count = connection.execute("SELECT count(*) FROM guests").fetchone()[0]
    connection.close()
    return count


def test_sql_select_shows_a_table_and_cuts_long_results(database: Path) -> None:
    with SqlDatabase(database, max_rows=5) as db:
        tools = ToolSet([db.tool()])
        assert "guests(id INTEGER, name TEXT, city TEXT)" in tools.specs()[0].description
        small = call(tools, "sql", query="SELECT id, name, city FROM guests WHERE id <= 2")
        assert small.content == "id | name | city\n1 | guest 0 | Oslo\n2 | guest 1 | NULL"
        big = call(tools, "sql", query="SELECT id FROM guests")
        assert big.content.splitlines()[1:6] == ["1", "2", "3", "4", "5"]
        assert big.content.endswith("... 75 more rows not shown; narrow the query or add LIMIT")
        assert call(tools, "sql", query="SELECT id FROM guests WHERE id < 0").content == "id\n(no rows)"


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM guests",
        "INSERT INTO guests (name) VALUES ('mallory')",
        "UPDATE guests SET name = 'x'",
        "DROP TABLE guests",
        "CREATE TABLE other (a)",
        "PRAGMA query_only = OFF",
        "PRAGMA journal_mode = DELETE",
        "ATTACH DATABASE 'other.db' AS other",
        "VACUUM",
    ],
)
def test_read_only_mode_blocks_every_write(database: Path, statement: str) -> None:
    with SqlDatabase(database) as db:
        result = call(ToolSet([db.tool()]), "sql", query=statement)
        assert result.error == "tool_error"
        assert "read-only" in result.content
        assert call(ToolSet([db.tool()]), "sql", query="SELECT count(*) FROM guests").content == "count(*)\n80"
    assert rows_in(database) == 80
    assert not (database.parent / "other.db").exists()


def test_write_mode_writes_but_still_blocks_attach(database: Path) -> None:
    with SqlDatabase(database, read_only=False) as db:
        tools = ToolSet([db.tool()])
        assert call(tools, "sql", query="DELETE FROM guests WHERE id = 1").content.startswith("OK")
        attach = call(tools, "sql", query="ATTACH DATABASE 'other.db' AS other")
        assert attach.error == "tool_error" and "ATTACH" in attach.content
    assert rows_in(database) == 79


def test_runaway_queries_and_bad_sql_become_observations(database: Path) -> None:
    with SqlDatabase(database, max_steps=100_000) as db:
        tools = ToolSet([db.tool()])
        endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
        stopped = call(tools, "sql", query=endless)
        assert stopped.error == "tool_error" and "stopped after 100,000 steps" in stopped.content
        assert "no such column: nope" in call(tools, "sql", query="SELECT nope FROM guests").content
        assert "one statement" in call(tools, "sql", query="SELECT 1; SELECT 2").content
        assert call(tools, "sql", query="SELECT 1").content == "1\n1"  # usable after the failures


def test_sql_is_safe_to_share_between_threads(database: Path) -> None:
    with SqlDatabase(database) as db:
        tools = ToolSet([db.tool()])
        results: list[str] = []

        def worker(i: int) -> None:
            results.append(call(tools, "sql", query=f"SELECT name FROM guests WHERE id = {i + 1}").content)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(results) == sorted(f"name\nguest {i}" for i in range(16))


def test_missing_database_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such SQLite database"):
        SqlDatabase(tmp_path / "absent.db")
    assert not (tmp_path / "absent.db").exists()
