"""No import circle among toolpolicy's modules: each arrow points down a layer
(DESIGN.md's table). Every import statement counts, the ones inside functions too: a
function-local import only hides a circle until that function runs."""

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "toolpolicy"


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The toolpolicy modules `path` imports, anywhere in it (`import_sites` without the lines)."""
    return {target for target, _ in import_sites(path, modules)}


def import_sites(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(module, line) for each toolpolicy module `path` imports, anywhere in it: `from a import b`
    is a.b when b is a module, else a; `import a.b` is a.b. Under `if TYPE_CHECKING:` nothing
    runs, so nothing counts."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skipped = {id(node) for guard in ast.walk(tree) if isinstance(guard, ast.If) and _type_checking(guard.test) for node in ast.walk(guard)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                out.append((f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base, node.lineno))
    return sorted({(name, line) for name, line in out if name in modules and name != here}, key=lambda site: site[1])


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph() -> dict[str, set[str]]:
    paths = sorted((SOURCE / PACKAGE).rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imports(path, modules) for path in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_circle_and_nothing_else():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_toolpolicys_modules():
    assert cycles(import_graph()) == []


def test_checks_imports_no_trainer_and_build_no_environment_of_its_own():
    graph = import_graph()
    assert not {m for m in graph["toolpolicy.checks"] if m.startswith("toolpolicy.trainer")}
    assert not {m for m in graph["toolpolicy.build"] if m.startswith("toolpolicy.envs.")}


def test_the_config_imports_only_what_sits_below_every_layer():
    """config.py is the typed config every layer reads: it imports no environment, backend or
    trainer (the flat config's options are a fixed table there, not read from the environments)."""
    assert import_graph()["toolpolicy.config"] <= {"toolpolicy.atomic", "toolpolicy.errors"}, import_graph()["toolpolicy.config"]
