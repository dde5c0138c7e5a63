"""The package's modules import each other without cycles, and none grows past 500 lines.

Every import counts, module-level and inside functions alike: a cycle hidden in a function
is still two modules that cannot be understood apart. Imports under ``if TYPE_CHECKING:``
never run, but a module naming a type of a module above it still depends on it: they count
too (:func:`import_graph` can leave them out, to tell the two kinds of cycle apart).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "inorder"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str], type_imports: bool) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree) if type_imports else _runtime_nodes(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            # `from inorder.sinks import fs` names the module inorder.sinks.fs
            while name and name not in modules:
                name = name.rsplit(".", 1)[0] if "." in name else ""
            if name and name != _module_name(path):
                found.add(name)
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        out.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return out


def import_graph(type_imports: bool = True) -> dict[str, set[str]]:
    """Module -> the package modules it imports (``type_imports``: those under
    ``if TYPE_CHECKING:`` too)."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    graph = {_module_name(f): _imports(f, modules, type_imports) for f in files}
    # A package's __init__ re-exporting its modules is not a dependency of those modules on
    # each other: drop edges into package __init__ files from their own submodules.
    for module, targets in graph.items():
        graph[module] = {t for t in targets if not module.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def _imports_into(graph: dict[str, set[str]], lower: str, upper: str) -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, targets in graph.items()
        if module.startswith(lower)
        for target in targets
        if target.startswith(upper)
    }


def test_the_source_rooms_import_no_archive() -> None:
    # kafka/ defines the Source protocol the archive's TieredSource implements; the ops tools
    # read through it. Neither reaches into archive/ (type-only imports count too).
    graph = import_graph()
    for folder in ("inorder.kafka", "inorder.ops"):
        found = _imports_into(graph, folder, "inorder.archive")
        assert not found, f"{folder} imports archive/: {sorted(found)}"


# Names kept importable from their earlier homes, for code written against earlier releases:
# a re-export pointing up is no dependency of the lower folder's own code. Each entry is one
# import (module, what it imports); the test below fails once an entry is no longer needed.
EARLIER_HOMES: set[tuple[str, str]] = {
    ("inorder.archive", "inorder.pipeline.archiver"),
    ("inorder.archive.archiver", "inorder.pipeline.archiver"),
}


def _folder(module: str) -> str | None:
    """The folder (subpackage of ``inorder``) a module is in; None for a top-level module."""
    parts = module.split(".")
    if len(parts) < 2 or not (PACKAGE / parts[1] / "__init__.py").exists():
        return None
    return parts[1]


def folder_imports(graph: dict[str, set[str]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(folder, folder it imports) -> the module imports behind it, earlier homes left out."""
    found: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for module, targets in graph.items():
        for target in targets:
            pair = (_folder(module), _folder(target))
            if None in pair or pair[0] == pair[1] or (module, target) in EARLIER_HOMES:
                continue
            found.setdefault((str(pair[0]), str(pair[1])), set()).add((module, target))
    return found


def test_no_two_folders_import_each_other() -> None:
    # Folders sit on floors (docs/architecture.md's table): a folder that imports another
    # and is imported by it is one package in two places, even with no module cycle.
    imports = folder_imports(import_graph())
    both = {
        (a, b): sorted(imports[(a, b)] | imports[(b, a)])
        for a, b in imports
        if a < b and (b, a) in imports
    }
    assert not both, "folders importing each other:\n" + "\n".join(
        f"{a} <-> {b}: {edges}" for (a, b), edges in sorted(both.items())
    )


def test_archive_imports_no_pipeline() -> None:
    # The archive's job runs beside the runner (pipeline/archiver.py); archive/ holds the
    # formats and readers the runner itself uses, so it never reaches up into pipeline/.
    upward = _imports_into(import_graph(), "inorder.archive", "inorder.pipeline") - EARLIER_HOMES
    assert not upward, f"archive/ imports pipeline/: {sorted(upward)}"


def test_earlier_homes_only_re_export() -> None:
    graph = import_graph()
    stale = {edge for edge in EARLIER_HOMES if edge[1] not in graph.get(edge[0], set())}
    assert not stale, f"no longer imported, remove from EARLIER_HOMES: {sorted(stale)}"
    for module in {edge[0] for edge in EARLIER_HOMES}:
        path = PACKAGE.parent.joinpath(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        defined = [
            node.name
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
        ]
        # A package may resolve its earlier names on first use (PEP 562), nothing more.
        assert set(defined) <= {"__getattr__", "__dir__"}, f"{module} defines {defined}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


MAX_LINES = 500
# Modules already longer when this check arrived: each may shrink, none may grow. Splitting
# one removes its entry; the test fails when an entry is no longer needed, so the list only
# gets shorter.
OVERSIZE: dict[str, int] = {}


def test_modules_stay_small() -> None:
    lengths = {
        _module_name(f): len(f.read_text().splitlines()) for f in sorted(PACKAGE.rglob("*.py"))
    }
    too_long = {m: n for m, n in lengths.items() if n > max(MAX_LINES, OVERSIZE.get(m, MAX_LINES))}
    assert not too_long, f"modules over {MAX_LINES} lines (split them): {too_long}"
    stale = {m: lengths.get(m, 0) for m in OVERSIZE if lengths.get(m, 0) <= MAX_LINES}
    assert not stale, f"no longer oversize, remove from OVERSIZE: {stale}"
