"""The site's home page is README.md: one text for the repository's front page and the site's.

A MkDocs hook (mkdocs.yml, `hooks:`). README.md sits outside docs/, so this adds it to the
site as index.md, its links into docs/ written from docs/ (`docs/policy.md` -> `policy.md`).
Any other relative link it has stays as written, so strict mode fails on it: the README
links only to pages, and names other files of the repository in code spans.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

INTO_DOCS = re.compile(r"\]\(docs/")


def on_files(files: Files, config) -> Files:
    readme = Path(config["config_file_path"]).parent / "README.md"
    files.append(File.generated(config, "index.md", content=INTO_DOCS.sub("](", readme.read_text(encoding="utf-8"))))
    return files
