"""kill -9 of a writer whose Delta sink compacts by the level rule after each commit.

A child process commits batches through ``DeltaSink(compact=True)`` (merging inside the
commit, or in its compactor thread beside the next commits) with fan-in 2, so almost every
commit merges, and SIGKILLs itself at its n-th seam: before or after a Delta commit (a
batch's or a merge's: delta-rs writes the log entry, so the seams are the calls into it) or
after a merged file is written. After every crash the table holds whole batches, each once;
the next run resumes. At the end: every batch once, merges of merges happened, and
``inorder verify`` holds with the merged files' digests.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from deltalake import DeltaTable
from tests.fixtures.sink_cases import assert_whole_batches

from inorder.ops.verify import verify
from inorder.sinks.delta import DeltaSink
from inorder.sinks.delta_compaction import live_files

ROOT = Path(__file__).resolve().parents[2]
ROWS = 20

WRITER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from deltalake import DeltaTable
    from inorder.sinks import delta_compaction
    from inorder.sinks.delta import DeltaSink
    from tests.fixtures.sink_cases import ID_SCHEMA, id_batch, stage_batch

    path, batches, rows, die_at = {path!r}, {batches}, {rows}, {die_at}
    steps = [0]

    def seam():
        steps[0] += 1
        if steps[0] == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    real_commit = DeltaTable.create_write_transaction

    def commit(self, *args, **kwargs):
        seam()
        done = real_commit(self, *args, **kwargs)
        seam()
        return done

    DeltaTable.create_write_transaction = commit
    real_write = delta_compaction._write

    def write(*args, **kwargs):
        rel = real_write(*args, **kwargs)
        seam()
        return rel

    delta_compaction._write = write
    sink = DeltaSink(
        path, partition_by=["topic"], compact=True, compaction_fanout=2,
        compact_in_background={background}, app_id="crash",
    )
    sink.check(ID_SCHEMA)
    last = sink.last_committed_batch()
    for batch_id in range(0 if last is None else last + 1, batches):
        sink.commit(batch_id, stage_batch(sink, batch_id, id_batch(batch_id, rows), key="t"))
    assert sink.finish_background() is None
    """
)


def _run(path: str, batches: int, die_at: int, background: bool) -> int:
    code = WRITER.format(
        root=str(ROOT), path=path, batches=batches, rows=ROWS, die_at=die_at,
        background=background,
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr[-3000:]
    return done.returncode


def _ids(path: str) -> list[int]:
    return list(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_kill9_while_compacting_a_delta_table_keeps_every_row_once(
    tmp_path: Path, background: bool
) -> None:
    path = str(tmp_path / "out")
    rng = random.Random(5)
    batches = kills = 0
    for _ in range(5):
        batches += 3
        kills += _run(path, batches, rng.randrange(1, 24), background) == -signal.SIGKILL
        assert_whole_batches(_ids(path), ROWS)
    assert kills >= 3, kills
    assert _run(path, batches, 0, background) == 0
    assert_whole_batches(_ids(path), ROWS, batches)
    assert any(f.level >= 2 for f in live_files(DeltaTable(path)))  # merges of merges
    report = verify(DeltaSink(path, app_id="crash"), None, digests=True)
    assert report.ok, [p.line() for p in report.problems]
