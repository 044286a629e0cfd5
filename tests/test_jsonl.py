"""The shared JSONL reader names the file, the line and the column of a broken line."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolpolicy.jsonl import read_objects


class Broken(ValueError):
    pass


def test_a_line_cut_short_is_reported_where_it_stops(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    whole = '{"phase": "rl", "step": 1, "reward": 0.5}'
    cut = '{"phase": "rl", "step": 2, "reward": 0.25, "lr": '  # a kill mid-write: 49 characters
    path.write_text(f"{whole}\n{cut}\n{whole}\n")
    with pytest.raises(Broken) as error:
        list(read_objects(path, Broken))
    # The value is missing right after the cut line's last character: column 50 of line 2.
    assert str(error.value) == f"{path}:2: not valid JSON (Expecting value at column {len(cut) + 1})"
    assert len(cut) + 1 == 50


def test_windows_line_ends_and_blank_lines_read_as_plain_lines(tmp_path: Path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\r\n{"a": 2}\r\n')
    assert [(where.rsplit(":", 1)[1], row) for where, row in read_objects(path, Broken)] == [("1", {"a": 1}), ("3", {"a": 2})]
