"""The test files that cover what changed: the inner loop of ``scripts/test.sh --changed``.

Changed files are those that differ from ``BASE`` (default ``HEAD``: uncommitted and
untracked changes; give ``main~3`` or a branch point for committed ones too). A changed test
file is selected itself; a changed module ``src/inorder/a/b.py`` selects every test file
that imports it, or a module that imports it (followed through the package's own imports,
so a change to a low module reaches the tests of what uses it). Prints one path a line.

    .venv/bin/python scripts/changed_tests.py [BASE]
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src"


def changed_files(base: str) -> list[Path]:
    """Files that differ from ``base``, plus untracked ones (paths from the repository)."""

    def git(*args: str) -> list[str]:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
        return [line for line in done.stdout.splitlines() if line]

    names = set(git("diff", "--name-only", base)) | set(
        git("ls-files", "--others", "--exclude-standard")
    )
    return sorted(ROOT / n for n in names if (ROOT / n).exists())


def module_name(path: Path) -> str | None:
    """``inorder.a.b`` for ``src/inorder/a/b.py``; ``tests.x.y`` for a test helper."""
    for root in (PACKAGE, ROOT):
        try:
            rel = path.relative_to(root)
        except ValueError:
            continue
        if rel.suffix != ".py":
            return None
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)
    return None


def imports_of(path: Path) -> set[str]:
    """Modules ``path`` imports, with ``from a import b`` also counted as ``a.b``."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def python_files() -> Iterable[Path]:
    yield from (PACKAGE / "inorder").rglob("*.py")
    yield from (ROOT / "tests").rglob("*.py")


def select(changed: Sequence[Path]) -> list[Path]:
    """Test files covering ``changed`` (see the module docstring)."""
    importers: dict[str, set[Path]] = defaultdict(set)
    names: dict[Path, str] = {}
    for path in python_files():
        name = module_name(path)
        if name is None:
            continue
        names[path] = name
        for imported in imports_of(path):
            importers[imported].add(path)
    wanted: set[str] = set()
    selected: set[Path] = set()
    for path in changed:
        name = module_name(path)
        if path.name.startswith("test_") and path.parent.is_relative_to(ROOT / "tests"):
            selected.add(path)
        elif name is not None:
            wanted.add(name)
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        for path in importers.get(name, ()):
            if path.name.startswith("test_"):
                selected.add(path)
            else:
                wanted.add(names[path])
    return sorted(selected)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the selected test files."""
    args = list(sys.argv[1:] if argv is None else argv)
    base = args[0] if args else "HEAD"
    for path in select(changed_files(base)):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
