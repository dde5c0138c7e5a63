"""kill -9 of a writer whose sink compacts by the level rule after each commit.

A child process commits batches through ``ParquetSink(compact=True)`` (merging inside the
commit, or in its compactor thread beside the next commits) with fan-in 2 (so
almost every commit merges, often over several rounds) and commit checkpoints every few
batches, and SIGKILLs itself right before its n-th filesystem step (a create-if-absent, a
publication, a marker, a delete): in a batch commit, a compaction round's commit point, its
publication, the removal of replaced files or a checkpoint. After every crash the committed
rows are whole batches, each once; the next run resumes and finishes what was left. At the
end: every batch once, no row rewritten more than ``L`` times, and the proofs of
``inorder verify`` hold.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.fixtures.sink_cases import assert_whole_batches, committed_ids

from inorder.ops.verify_parquet import collect_parquet
from inorder.sinks.parquet import ParquetSink, committed_files
from inorder.storage import fs as sfs

ROOT = Path(__file__).resolve().parents[2]
ROWS = 20
LEVELS = 3

WRITER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from inorder.storage import fs as sfs
    from inorder.sinks.parquet import ParquetSink
    from tests.fixtures.sink_cases import ID_SCHEMA, id_batch, stage_batch

    path, batches, rows, die_at = {path!r}, {batches}, {rows}, {die_at}
    steps = [0]

    def step(real):
        def wrapped(*args, **kwargs):
            steps[0] += 1
            if steps[0] == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return wrapped

    for name in ("put_if_absent", "move", "write_bytes", "delete_quietly"):
        setattr(sfs, name, step(getattr(sfs, name)))
    sink = ParquetSink(
        path, partition_by=["topic"], compact=True, compaction_fanout=2,
        compaction_levels={levels}, compaction_grace_seconds=0, checkpoint_interval=4,
        manifest_retention=2, compact_in_background={background},
    )
    sink.check(ID_SCHEMA)
    last = sink.last_committed_batch()
    for batch_id in range(0 if last is None else last, batches):
        sink.commit(batch_id, stage_batch(sink, batch_id, id_batch(batch_id, rows), key="t"))
    assert sink.finish_background() is None
    """
)


def _run(path: str, batches: int, die_at: int, background: bool) -> int:
    code = WRITER.format(
        root=str(ROOT), path=path, batches=batches, rows=ROWS, die_at=die_at, levels=LEVELS,
        background=background,
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr[-3000:]
    return done.returncode


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_kill9_while_compacting_by_level_keeps_every_row_once(
    tmp_path: Path, background: bool
) -> None:
    # In the background the kill lands on a step of either thread: a batch commit, or a
    # merge running beside the next batches' commits.
    path = str(tmp_path / "out")
    rng = random.Random(11)
    batches = kills = 0
    rounds = 8 if background else 12  # the inline rounds reach every step kind already
    for _ in range(rounds):
        batches += 3
        kills += _run(path, batches, rng.randrange(1, 60), background) == -signal.SIGKILL
        assert_whole_batches(committed_ids(path, None), ROWS)
    assert kills >= rounds // 2, kills
    assert _run(path, batches, 0, background) == 0
    assert_whole_batches(committed_ids(path, None), ROWS, batches)
    files = committed_files(path)
    assert files and max(f.level for f in files) <= LEVELS
    assert any(f.level >= 2 for f in files)  # merges of merges happened
    # No record ever replaced a final file: each row was rewritten at most LEVELS times.
    loc = sfs.resolve(path)
    levels: dict[str, int] = {}
    for info in sorted(
        sfs.list_files(loc, loc.join("_inorder/compactions")), key=lambda i: i.base_name
    ):
        if info.base_name.endswith(".json"):
            record = json.loads(sfs.read_bytes(loc, info.path))
            assert all(levels.get(old, 0) < LEVELS for old in record["replaces"])
            levels.update({e["final"]: e["level"] for e in record["files"]})
    assert collect_parquet(ParquetSink(path), None).problems == []
