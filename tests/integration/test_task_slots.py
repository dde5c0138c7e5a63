"""Task slots: a range group's state cache follows the group, not the worker process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.test_partition_backend import make_backend
from tests.integration.test_state_store import CODEC, entry
from tests.property.procs import MsgCodec, Tallier, as_comparable, record

from inorder.engine.reference import ReferenceRunner
from inorder.engine.task import TASK_SLOT_MIN_PARTITIONS
from inorder.integrity import Integrity
from inorder.records import TopicPartition
from inorder.sinks.parquet import read_committed
from inorder.state.checkpoint import CheckpointStore
from inorder.state.entry import PartitionMeta
from inorder.state.registry import REGISTRY
from inorder.state.store import PartitionStore, StateOptions, close_task_slot
from inorder.state.store_commit import commit_partitions

TPS = [TopicPartition("orders", p) for p in range(3)]

# Runs one batch of the three partitions in another process, in the task slot named.
_OTHER_PROCESS = """
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.integration.test_task_slots import run_group
mode, batch, slot = sys.argv[4], int(sys.argv[5]), sys.argv[6]
if mode == "hold":
    run_group(sys.argv[2], sys.argv[3], batch, slot, close=False)
    print("holding", flush=True)
    time.sleep(600)
print(" ".join(run_group(sys.argv[2], sys.argv[3], batch, slot)), flush=True)
"""


def run_group(root: str, cache: str, batch: int, slot: str, close: bool = True) -> list[str]:
    """Apply one batch to the three partitions as one task in ``slot``; how each found its
    cache (``current``, ``caught_up`` or ``rebuilt``)."""
    checkpoint = CheckpointStore(root)
    options = StateOptions(snapshot_interval=100, cache_dir=cache)
    found = []
    for tp in TPS:
        with PartitionStore(checkpoint, tp, CODEC, "epoch-1", options, slot) as store:
            store.open(batch)
            commit_partitions([(store, {f"k{batch}": entry(batch)}, PartitionMeta(batch, None))])
            stats = store.stats
            found.append(
                "current" if stats.cache_hit else "caught_up" if stats.caught_up else "rebuilt"
            )
    if close:
        close_task_slot(root, options, slot)
    return found


def _in_other_process(root: str, cache: Path, mode: str, batch: int, slot: str) -> Any:
    repo = str(Path(__file__).resolve().parents[2])
    args = [sys.executable, "-c", _OTHER_PROCESS, repo, root, str(cache), mode, str(batch), slot]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=repo)


def test_a_group_finds_its_cache_current_in_whichever_process_runs_it(tmp_path: Path) -> None:
    root, cache = str(tmp_path / "ckpt"), tmp_path / "cache"
    assert run_group(root, str(cache), 0, "group@0") == ["rebuilt"] * 3  # cold
    # The next batch of the group runs in another process: it opens the group's slot, which
    # this process closed at the end of its task, and finds every partition current.
    proc = _in_other_process(root, cache, "commit", 1, "group@0")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.split() == ["current"] * 3
    # Back here: current again (without the slot, this process's views would be one behind).
    assert run_group(root, str(cache), 2, "group@0") == ["current"] * 3
    slots = sorted(p.name for p in cache.glob("*/*") if p.is_dir())
    assert slots == ["group@0"]
    assert not any(p.startswith(str(cache)) for p in REGISTRY.held_paths())  # closed


def test_a_slot_held_by_another_process_falls_back_to_the_process_slot(tmp_path: Path) -> None:
    root, cache = str(tmp_path / "ckpt"), tmp_path / "cache"
    run_group(root, str(cache), 0, "group@1")
    proc = _in_other_process(root, cache, "hold", 1, "group@1")  # e.g. a concurrent attempt
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        # Not waited for: this task uses its process slot, rebuilt from the checkpoint there.
        assert run_group(root, str(cache), 2, "group@1") == ["rebuilt"] * 3
        held = [p for p in REGISTRY.held_paths() if p.startswith(str(cache))]
        assert [Path(p).name for p in held] == ["proc@0"]
    finally:
        proc.kill()
        proc.wait(30)
    # The holder is gone (its lock with it): the slot is the group's again, one batch behind.
    assert run_group(root, str(cache), 3, "group@1") == ["caught_up"] * 3
    REGISTRY.close_all()


def test_grouped_tasks_find_every_partition_current_whatever_their_worker(
    spark: Any, tmp_path: Path
) -> None:
    from inorder.testing.memory import records_dataframe

    groups = 2
    tps = [TopicPartition("t", p) for p in range(groups * TASK_SLOT_MIN_PARTITIONS + 2)]
    batches = [
        [
            record(o, "abc"[o % 3], v=o, t=float(o), partition=tp.partition)
            for tp in tps
            for o in range(first, first + 3)
        ]
        for first in range(0, 12, 3)
    ]
    backend = make_backend(tmp_path)  # checkpoint in ckpt, Parquet output in out
    backend.state_options = StateOptions(cache_dir=str(tmp_path / "cache"))
    backend.max_tasks = groups
    reports = [
        backend.run_batch(records_dataframe(spark, b, tps, groups=groups), i)
        for i, b in enumerate(batches)
    ]
    assert [len(r.partitions) for r in reports] == [len(tps)] * len(batches)
    assert reports[0].state_opens["rebuilt"] == len(tps)
    # Spark places each task in whichever worker is idle; the group's cache goes with it.
    for r in reports[1:]:
        assert r.state_opens["current"] == len(tps), [r.state_opens for r in reports]
        assert r.state_opens["databases"] == groups, [r.state_opens for r in reports]
    slots = sorted(p.name for p in (tmp_path / "cache").glob("*/*") if p.is_dir())
    assert slots == [f"group@{g}" for g in range(groups)]
    from inorder.engine.context import from_micros

    ref = ReferenceRunner(Tallier(), MsgCodec(), Integrity.strict())
    for i, b in enumerate(batches):
        ref.run_batch(b, i, from_micros(backend.checkpoint.batch_time_us(i)), tps)
    got = read_committed(str(tmp_path / "out")).to_pylist()
    assert as_comparable(got) == as_comparable(ref.result.rows) and got
