"""The documentation cannot drift from the code: the site builds in strict mode, every link of
README.md resolves, every command it lists exists with the options it shows, every config and
policy snippet loads, and the quick start's commands run.

A ```yaml block on a page is a toolpolicy file or it says it is not: a block whose top-level keys
are config sections (`run`, `model`, `env`, ...) is loaded by the config loader, any other by the
policy loader, and a block that is neither starts with `# not loaded: WHY`, which this file
skips and counts. Policy blocks of docs/policy.md are loaded here too; tests/test_policy_docs.py
checks the decisions that page states about them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from markdown.extensions.toc import slugify

from toolpolicy.build import load_config
from toolpolicy.cli import build_parser, main
from toolpolicy.config import Config
from toolpolicy.gate.policy import Policy

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
NOT_LOADED = "# not loaded: "

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```$", re.M | re.S)
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


def without_code(text: str) -> str:
    """The page with its fenced blocks blanked out, so a `#` line of a shell block is no heading."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def anchors(page: Path) -> set[str]:
    """The ids the site gives the page's headings: MkDocs' (Python-Markdown's toc) slugs of their text."""
    return {slugify(re.sub(r"[`*]", "", heading), "-") for heading in HEADING.findall(without_code(page.read_text()))}


def relative(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_site_builds_in_strict_mode(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    home = (tmp_path / "site" / "index.html").read_text()
    assert "The main job: a tiny model learns when to call a calculator" in home  # README.md is the home page


def test_every_relative_link_of_the_readme_resolves():
    checked = 0
    for target in LINK.findall(without_code(README.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (README.parent / path) if path else README
        assert file.exists(), f"README.md links to {target}, which is not in the repository"
        if anchor:
            assert file.suffix == ".md", f"README.md links to an anchor of {path}, which is not a page"
            assert anchor in anchors(file), f"README.md links to #{anchor}, which no heading of {relative(file)} gives"
        checked += 1
    assert checked > 20  # the guide links to every page


def test_a_page_links_to_another_page_by_link_not_by_code_span():
    """A page named in a code span is a link the site does not check: write it as a link."""
    named = [(relative(page), span) for page in PAGES
             for span in re.findall(r"`(docs/[\w/-]+\.md)[^`]*`", without_code(page.read_text()))]
    assert named == []


def command_rows() -> list[str]:
    """The first cell of each row of README.md's table of commands."""
    return re.findall(r"^\| `(toolpolicy [^`]+)` \|", README.read_text(), re.M)


def quick_start() -> list[str]:
    """The toolpolicy commands of the README's set-up section (the make block aside)."""
    section = README.read_text().split("## Set up and run", 1)[1].split("\n## ", 1)[0]
    return [line for _, block in FENCE.findall(section) for line in block.splitlines() if line.startswith("toolpolicy ")]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((action.choices for action in parser._actions if isinstance(action, argparse._SubParsersAction)), {})


def resolve(words: list[str]) -> tuple[list[str], argparse.ArgumentParser]:
    """The command path the words name (`gate serve`) and its parser; alternatives `sft\\|train` are split by the caller."""
    parser, path = build_parser(), []
    for word in words:
        choices = subcommands(parser)
        if word not in choices:
            break
        parser, path = choices[word], [*path, word]
    return path, parser


def test_every_command_the_readme_shows_exists_with_its_options():
    shown = command_rows() + quick_start()
    assert len(command_rows()) >= 18 and len(quick_start()) >= 3
    for text in shown:
        words = text.replace("\\|", "|").split()[1:]
        for first in words[0].split("|"):
            path, parser = resolve([first, *words[1:]])
            assert path and not subcommands(parser), f"README.md shows `{text}`: `toolpolicy {' '.join(path)}` is not a command"
            options = {option for action in parser._actions for option in action.option_strings}
            shown_options = {word.strip("[]").split("=")[0] for word in words if word.lstrip("[").startswith("--") and word.strip("[]") != "--"}
            assert shown_options <= options, f"`{text}`: toolpolicy {' '.join(path)} has no {sorted(shown_options - options)}"


def snippets() -> list[tuple[str, str, str]]:
    """(page:line, info string, text) of every fenced block of every page."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{relative(page)}:{line}", match.group(1), match.group(2)))
    return found


def yaml_blocks() -> list[tuple[str, str]]:
    return [(where, text) for where, info, text in snippets() if info == "yaml"]


def is_config(data: object) -> bool:
    return isinstance(data, dict) and bool(data) and set(data) <= set(Config.model_fields)


@pytest.mark.parametrize(("where", "text"), yaml_blocks(), ids=[where for where, _ in yaml_blocks()])
def test_every_yaml_block_is_a_config_or_a_policy_that_loads(where, text, tmp_path, monkeypatch):
    if text.startswith(NOT_LOADED):
        pytest.skip(text.splitlines()[0].removeprefix(NOT_LOADED))
    monkeypatch.chdir(ROOT)  # relative paths in a snippet are the repository's, as the commands run them
    if is_config(yaml.safe_load(text)):
        file = tmp_path / "snippet.yaml"
        file.write_text(text)
        load_config(file)  # raises ConfigError naming the section and field
    else:
        Policy.from_yaml(text, where)  # raises PolicyError naming the problem


def test_the_yaml_blocks_are_both_kinds_and_none_hides_in_another_fence():
    blocks = yaml_blocks()
    configs = [where for where, text in blocks if is_config(yaml.safe_load(text))]
    assert len(configs) >= 8 and len(blocks) - len(configs) >= 10
    # A config or policy written in a fence without `yaml` would escape the test above.
    hidden = []
    for where, info, text in snippets():
        if info in ("", "text"):
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if is_config(data) or (isinstance(data, dict) and {"rules", "default"} & set(data)):
                hidden.append(where)
    assert hidden == [], "write these blocks as ```yaml so they are loaded"


def test_the_quick_start_runs_on_a_finished_demo(smoke_run, tmp_path, monkeypatch, capsys):
    """The README's commands after `make demo`, on the smoke configuration's run of the same job
    (copied, so the shared run stays as the other tests expect it)."""
    run = tmp_path / "demo"
    shutil.copytree(smoke_run, run)
    monkeypatch.chdir(ROOT)
    for line in quick_start():
        command, _, comment = line.partition("  #")
        args = [str(run) if word == "runs/demo" else word for word in shlex.split(command)][1:]
        expected = int(re.search(r"exit status (\d+)", comment).group(1)) if "exit status" in comment else 0
        code = main(args)
        out = capsys.readouterr().out
        assert code == expected, f"`{command.strip()}` exited {code}, the README says {expected}:\n{out}"
        assert out.strip(), f"`{command.strip()}` printed nothing"
    assert (run / "report.html").stat().st_mtime > (smoke_run / "report.html").stat().st_mtime


def test_every_file_a_page_names_from_the_repository_root_exists():
    """`bench/x.py`, `docs/results/...`, `examples/...`: a path from the root in a code span is a
    file or folder of the repository (a glob matches one); placeholders (`served_SUITE.json`) and
    paths spelled to attack a policy (`docs/../../etc`) aside."""
    missing = []
    for page in PAGES:
        for span in re.findall(r"`((?:src|bench|examples|tests|docs|checkpoints)/[^`\s]*)`", page.read_text()):
            path = span.split(":")[0]
            if ".." in path or any(part.isupper() for part in re.split(r"[/._-]", path) if part):
                continue
            if not (sorted(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{relative(page)}: {span}")
    assert missing == []


def results_rows() -> list[tuple[str, list[Path]]]:
    """The README's results table: each row's result cell and the pages it links to."""
    section = README.read_text().split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        links = re.findall(r"\]\(([^)#]+)", cells[-1]) if len(cells) == 3 else []
        if links:
            rows.append((cells[1], [ROOT / link for link in links]))
    return rows


FIGURE = re.compile(r"\d[\d,]*\.\d+(?:%| µs| ms|x)?|\d[\d,]*(?:%| µs| ms|x)")
"""A figure as a results cell writes it: a decimal, a percentage, a latency or a ratio."""


def test_every_figure_of_the_readme_results_table_stands_on_its_page():
    """The headline table repeats its pages' figures; each must be on a page the row links to
    (where the tables are rendered from result files) or in the README's own rendered demo
    table, so the README cannot drift from them."""
    rows = results_rows()
    assert len(rows) >= 10
    readme = README.read_text().split("\n## Results\n", 1)[0]
    for cell, pages in rows:
        text = " ".join([readme, *(page.read_text() for page in pages)])
        missing = [figure for figure in FIGURE.findall(cell) if figure not in text]
        assert not missing, f"README.md's results row {cell[:60]!r}: {missing} not on {[relative(p) for p in pages]}"
