"""``inorder.checkpoint`` sits on a low floor: the runner, the ops tools, the archive and the
status page all read the checkpoint through it, so it may import only what lies below them."""

from __future__ import annotations

from tests.unit.test_import_graph import import_graph

#: What the checkpoint package may import (besides itself).
ALLOWED = ("inorder.errors", "inorder.records", "inorder.storage", "inorder.state")


def test_the_checkpoint_package_imports_nothing_above_it() -> None:
    graph = import_graph()
    found = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module == "inorder.checkpoint" or module.startswith("inorder.checkpoint.")
        for target in targets
        if not target.startswith("inorder.checkpoint")
        and not any(target == a or target.startswith(a + ".") for a in ALLOWED)
    }
    assert not found, "inorder.checkpoint imports above its floor:\n" + "\n".join(sorted(found))


def test_the_archive_reads_checkpoints_without_the_ops_tools() -> None:
    graph = import_graph()
    found = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("inorder.archive.")
        for target in targets
        if target.startswith("inorder.ops")
    )
    assert not found, "\n".join(found)
