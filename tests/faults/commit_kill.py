"""``inorder`` that kills itself (``SIGKILL``) at one named point of a batch's commit.

``python -m tests.faults.commit_kill POINT BATCH inorder-arguments...`` runs the CLI in this
process with one hook armed; the first time the driver reaches ``POINT`` for checkpoint batch
``BATCH`` or later, it prints ``commit-kill: POINT batch B`` to stderr and sends itself
``SIGKILL``: no ``finally``, no atexit, no flush, exactly as a ``kill -9`` landing there.

Points, in the order one batch passes them:

* ``staged``: every task has staged its files; the change log's commit has not started.
* ``manifest``: the change log's manifest (the batch's commit point) is written; its
  publication has not started.
* ``tables``: the change log's commit is complete; the session tables' commits have not
  started.
* ``between-tables``: the current table's commit is done; the history table's is not.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

POINTS = ("staged", "manifest", "tables", "between-tables")


def _die(point: str, batch: int) -> None:
    sys.stderr.write(f"commit-kill: {point} batch {batch}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, at_batch: int) -> None:
    """Patch the one function whose entry (or return) is ``point``."""
    if point == "staged":
        from inorder.engine.partition import PartitionBackend

        commit = PartitionBackend.commit

        def staged(self: Any, batch_id: int, results: Any) -> Any:
            if batch_id >= at_batch:
                _die(point, batch_id)
            return commit(self, batch_id, results)

        PartitionBackend.commit = staged  # type: ignore[method-assign]
    elif point == "manifest":
        from inorder.sinks import parquet
        from inorder.sinks.commit_log import manifest_name

        complete = parquet.complete_manifest

        def manifest(location: Any, rel: str) -> Any:
            batch_id = int(rel.rsplit("/", 1)[-1][:20])
            if batch_id >= at_batch and rel.endswith(manifest_name(batch_id)):
                _die(point, batch_id)
            return complete(location, rel)

        parquet.complete_manifest = manifest  # type: ignore[assignment]
    elif point == "tables":
        from inorder.sessions.tables_writer import SessionTablesWriter

        after_commit = SessionTablesWriter.after_commit

        def tables(self: Any, batch_id: int) -> Any:
            if batch_id >= at_batch:
                _die(point, batch_id)
            return after_commit(self, batch_id)

        SessionTablesWriter.after_commit = tables  # type: ignore[method-assign]
    elif point == "between-tables":
        from inorder.sessions.tables_delta import DeltaTableOutput

        merge = DeltaTableOutput.merge

        def between(self: Any, plan: Any, changes: Any, first: int, last: int) -> Any:
            done = merge(self, plan, changes, first, last)
            if self.kind == "current" and last >= at_batch:
                _die(point, last)
            return done

        DeltaTableOutput.merge = between  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown point {point!r}: one of {', '.join(POINTS)}")


if __name__ == "__main__":
    arm(sys.argv[1], int(sys.argv[2]))
    from inorder.cli import main

    sys.exit(main(sys.argv[3:]))
