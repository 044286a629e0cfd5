"""The project's metadata agrees with its code and its docs: the lowest Python it claims is one the code runs on."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEEDS_3_11 = re.compile(r"\b(?:Base)?ExceptionGroup\b|^\s*import tomllib\b|\bexcept\*", re.MULTILINE)
"""Names and syntax Python 3.10 does not have."""


def lowest_python() -> tuple[int, int]:
    """(major, minor) from pyproject.toml's requires-python, which must be a plain ">=X.Y"."""
    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec)
    assert match, f"requires-python {spec!r} is not of the form >=X.Y"
    return int(match[1]), int(match[2])


def test_requires_python_covers_what_the_code_uses():
    users = sorted(str(p.relative_to(REPO)) for p in (REPO / "src").rglob("*.py") if NEEDS_3_11.search(p.read_text()))
    if users:  # e.g. the MCP client unwrapping anyio's ExceptionGroups
        assert lowest_python() >= (3, 11), f"{users} need Python 3.11"
    assert sys.version_info[:2] >= lowest_python()  # the interpreter running the tests is a supported one


def test_developers_md_names_the_lowest_version():
    major, minor = lowest_python()
    assert f"Python {major}.{minor} is the lowest supported version" in (REPO / "DEVELOPERS.md").read_text()
