"""docs/architecture.md's Layers table is the package's import graph, measured folder by folder.

Each top-level module or folder of src/toolpolicy is a layer and has one row; the row's
"imports" cell lists every layer its files import (every import statement, the ones inside
functions too, none under TYPE_CHECKING: tests/test_layers.py's graph), each a row above it,
so the folders make no circle. An arrow that points down the table, a new import across layers, a layer without a row, a row that is no
layer, an arrow the code no longer has: each fails here, naming the file and the line.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_layers import PACKAGE, SOURCE, cycles, import_sites, module_name

from toolpolicy.config import SECTIONS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
ENTRY = re.compile(r"`([^`]+)`")
NONE = "—"


def layer_of(module: str) -> str:
    """A module's layer, as the table names it: `types.py`, `chat/`, `__init__.py` (the package itself)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if (SOURCE / PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"


def measured() -> dict[str, dict[str, list[str]]]:
    """layer -> layer it imports -> the import lines that make the arrow ("src/toolpolicy/x.py:12: from ...")."""
    paths = sorted((SOURCE / PACKAGE).rglob("*.py"))
    modules = {module_name(path) for path in paths}
    graph: dict[str, dict[str, list[str]]] = {}
    for path in paths:
        source = layer_of(module_name(path))
        arrows = graph.setdefault(source, {})
        lines = path.read_text().splitlines()
        for target, line in import_sites(path, modules):
            if layer_of(target) != source:
                site = f"{path.relative_to(ROOT)}:{line}: {lines[line - 1].strip()}"
                arrows.setdefault(layer_of(target), []).append(site)
    return graph


def table(text: str) -> list[tuple[str, set[str]]]:
    """The Layers table's rows in order: (layer, the layers it imports)."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    assert rows, "docs/architecture.md: the Layers section has no table"
    out = []
    for line in rows:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        name, imports = cells[0].strip("`"), cells[-1]
        rest = ENTRY.sub("", imports).replace(",", "").strip()
        assert rest in ("", NONE), f"docs/architecture.md, row {name}: imports cell {imports!r} is not `layer`, ... (or {NONE})"
        out.append((name, {m.group(1) for m in ENTRY.finditer(imports)}))
    return out


def problems(rows: list[tuple[str, set[str]]], graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """Every way the table and the measured graph disagree, each a sentence naming the page, file and line."""
    where = {name: index for index, (name, _) in enumerate(rows)}
    found = []
    for name in where.keys() - graph.keys():
        found.append(f"docs/architecture.md lists `{name}`, which src/toolpolicy does not have (no module or folder of Python files)")
    for name in sorted(graph.keys() - where.keys()):
        found.append(f"src/toolpolicy has `{name}`, which the Layers table of docs/architecture.md has no row for")
    for name, listed in rows:
        arrows = graph.get(name, {})
        for target in sorted(listed - where.keys()):
            found.append(f"docs/architecture.md, row `{name}`: imports `{target}`, which is no row of the table")
        for target in sorted(listed - arrows.keys()):
            found.append(f"docs/architecture.md, row `{name}`: lists `{target}`, which no file of `{name}` imports today")
        for target, sites in sorted(arrows.items()):
            lines = "".join(f"\n    {site}" for site in sites)
            if target not in listed:
                found.append(f"`{name}` imports `{target}`, which its row of docs/architecture.md does not list:{lines}")
            elif target in where and where[target] > where[name]:
                found.append(f"`{name}` imports `{target}`, a row below it in docs/architecture.md (a row imports only rows above it):{lines}")
    return found


def test_the_layers_table_is_the_measured_import_graph():
    graph = measured()
    assert len(graph) > 20 and sum(map(len, graph.values())) > 80  # every top-level module and folder, and their arrows
    found = problems(table(PAGE.read_text()), graph)
    assert not found, "\n".join(found)


def test_the_folders_make_no_circle():
    """The folder graph has no circle, so the rows have an order in which each imports only rows above it."""
    graph = {name: set(arrows) for name, arrows in measured().items()}
    assert cycles(graph) == []
    assert cycles({**graph, "rollout/": graph["rollout/"] | {"report/"}}), "the check finds a circle when there is one"


def _edit_row(text: str, name: str, old: str, new: str) -> str:
    """The page with `old` replaced by `new` in `name`'s row only."""
    line = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
    assert old in line, (name, old)
    return text.replace(line, line.replace(old, new, 1))


def test_the_check_fails_on_a_missing_arrow_an_unknown_folder_and_an_arrow_up():
    text, graph = PAGE.read_text(), measured()
    assert problems(table(text), graph) == []

    dropped = _edit_row(text, "rollout/", "`chat/`, ", "")  # the engine's template import, left out
    (found,) = problems(table(dropped), graph)
    assert "`rollout/` imports `chat/`, which its row" in found and "src/toolpolicy/rollout/" in found and "from toolpolicy.chat" in found

    rows = table(text)
    (found,) = problems([*rows, ("widgets/", {})], graph)
    assert "lists `widgets/`, which src/toolpolicy does not have" in found

    found = problems(table(text.replace("| `gate/` |", "| `gates/` |")), graph)
    assert any("lists `gates/`, which src/toolpolicy does not have" in problem for problem in found)
    assert any("has `gate/`, which the Layers table of docs/architecture.md has no row for" in problem for problem in found)

    types_last = [row for row in rows if row[0] != "types.py"] + [row for row in rows if row[0] == "types.py"]
    found = problems(types_last, graph)
    assert found and all("a row below it" in problem for problem in found)
    assert any("`chat/` imports `types.py`, a row below it" in problem and "src/toolpolicy/chat/" in problem for problem in found)

    stale = _edit_row(text, "types.py", NONE, "`chat/`")
    assert any("lists `chat/`, which no file of `types.py` imports today" in problem for problem in problems(table(stale), graph))


DOTTED = re.compile(r"`((?:[a-z_]+\.)+)([A-Za-z_]\w*)[(`]")


def test_every_module_function_the_page_names_with_dots_exists():
    """`build.load_config`, `trainer.update.algorithm_of(...)`: a module of the package and a
    function or class of it (tests/test_architecture_doc.py checks the `path.py:name` spans)."""
    checked = 0
    for match in DOTTED.finditer(PAGE.read_text()):
        parts, name = match.group(1).rstrip(".").split("."), match.group(2)
        if parts[0] in SECTIONS or name in ("py", "md", "toml", "json", "yaml"):
            continue  # a config field (`model.sharing`, `rl.lr`) or a file name
        file = next((f for f in (SOURCE / PACKAGE / Path(*parts).with_suffix(".py"), SOURCE / PACKAGE / Path(*parts) / "__init__.py") if f.is_file()), None)
        if file is None:
            continue
        assert re.search(rf"^(def|class)\s+{name}\b", file.read_text(), re.MULTILINE), f"docs/architecture.md names {match.group(1)}{name}, which {file.relative_to(ROOT)} does not define"
        checked += 1
    assert checked >= 8
