"""docs/architecture.md names files and functions a newcomer opens: each must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "toolpolicy"


def cited() -> list[tuple[str, str | None]]:
    """(path, name) for every `path.py` or `path.py:name` in backticks; paths are from the repo or the package."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return [(m.group(1), m.group(2)) for m in re.finditer(r"`([\w/]+\.(?:py|md|toml))(?::([\w.]+))?`", text)]


def test_every_file_and_name_the_architecture_page_cites_exists():
    found = cited()
    assert len(found) > 30  # the page cites the files of every layer
    for path, name in found:
        file = next((base / path for base in (ROOT, PACKAGE) if (base / path).is_file()), None)
        assert file is not None, f"docs/architecture.md cites {path}, which is not in the repository"
        if name:
            last = name.split(".")[-1]
            assert re.search(rf"\b(def|class)\s+{last}\b|^{last}\b", file.read_text(), re.M), f"{path} has no {name}"
