"""The session-table job written with Quix Streams (the pure-Python library users would pick).

Run inside the Quix virtualenv that ``bench/_quix.py`` builds (quixstreams pins an older
confluent-kafka than the project's), with the inorder tree's ``src`` on ``PYTHONPATH``::

    .venv-bench-quix/bin/python bench/quix_sessions.py --bootstrap HOST:PORT --prefix P \\
        --out DIR --state-dir DIR --total N [--commit-every M]

One Quix ``Application`` (exactly-once, ``earliest``, a fresh consumer group per run) over
every topic whose name starts with ``--prefix``: one ``StreamingDataFrame`` per topic with a
stateful ``apply`` keyed by the Kafka key (the session id), applying inorder's
``SessionTables(row_key="id")`` to a :class:`SessionState` kept in Quix state (RocksDB, with
its changelog topic, as Quix runs by default). A message that breaks a session rule or cannot
be decoded drops the session's state and yields one ``reset`` row, as ``pure_python_rate`` in
``bench/e2e_throughput.py`` does. The change rows go to a ``BatchingSink`` that writes one
Parquet (zstd) file per checkpoint, so output lands on Quix's own commits; a checkpoint is
taken every ``--commit-every`` messages (inorder's ``maxOffsetsPerTrigger``).

The run stops once ``--total`` messages have been processed (``app.run(count=...)``: every
message yields exactly one output, the sink's) and prints one JSON line: records, rows,
files, seconds (process start to the end of the run), start-up (process start to the first
message), and every checkpoint (Unix time of its sink flush, messages since the one before).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as a script, imported from the bench directory or as ``bench.<module>``: the shared
# session-job pieces live beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _session_rows import CHANGE_COLUMNS, SessionContext, change_schema

#: The Quix state key of a session's state (Quix prefixes it with the message key).
STATE_KEY = "session"


def process_start_epoch() -> float:
    """This process's start as a Unix time (Linux ``/proc``; else the current time).

    ``/proc/self/stat`` gives the start in clock ticks since boot and ``/proc/uptime`` the
    seconds since boot, so the start is known to ~10 ms without a clock read before exec.
    """
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + int(stat[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


STARTED = process_start_epoch()


def state_to_builtins(state: Any) -> dict[str, Any]:
    """A :class:`SessionState` as the JSON-compatible dict Quix state stores."""
    return {"started": state.started, "seq": state.seq, "rows": state.rows}


def state_from_builtins(value: dict[str, Any]) -> Any:
    """The :class:`SessionState` of :func:`state_to_builtins` (its ``rows`` dict is reused)."""
    from inorder.sessions.processor import SessionState

    return SessionState(started=value["started"], seq=value["seq"], rows=value["rows"])


def change_columns(
    topic: str, partition: int, items: Iterable[tuple[int, Iterable[Any]]]
) -> list[list[Any]]:
    """Columns (:data:`CHANGE_COLUMNS`) of the change rows of ``(offset, changes)`` pairs."""
    cols: list[list[Any]] = [[] for _ in CHANGE_COLUMNS]
    for offset, changes in items:
        for c in changes:
            cols[0].append(topic)
            cols[1].append(partition)
            cols[2].append(offset)
            cols[3].append(c.kafka_ts)
            cols[4].append(c.session)
            cols[5].append(c.seq)
            cols[6].append(c.op)
            cols[7].append(c.row_id)
            cols[8].append(c.row)
    return cols


def topics_with_prefix(bootstrap: str, prefix: str) -> list[str]:
    """The names of the broker's topics that start with ``prefix``."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return sorted(t for t in meta.topics if t.startswith(prefix))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the Quix application over the backlog; what it did (the JSON line's fields)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import quixstreams
    from quixstreams import Application
    from quixstreams.sinks import BatchingSink, SinkBatch
    from quixstreams.state import State

    from inorder.codecs.base import DecodeError
    from inorder.processor import Violation
    from inorder.sessions.messages import SessionCodec
    from inorder.sessions.processor import SessionChange, SessionState, SessionTables

    schema = change_schema()
    assert tuple(schema.names) == CHANGE_COLUMNS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    processor = SessionTables(row_key="id")
    codec = SessionCodec("id")
    ctx = SessionContext()
    # Messages applied so far and the first one's arrival (one thread runs all callbacks).
    seen = [0]
    first_at: list[float] = []

    class ParquetChanges(BatchingSink):
        """Change rows of a checkpoint as one Parquet (zstd) file, written at its commit."""

        def __init__(self) -> None:
            super().__init__()
            self.rows = 0
            self.files = 0
            self.commits: list[tuple[float, int]] = []
            self._parts: list[pa.RecordBatch] = []
            self._committed = 0

        def write(self, batch: SinkBatch) -> None:
            """Convert one topic-partition's rows; the file is written by :meth:`flush`."""
            cols = change_columns(
                batch.topic, batch.partition, ((item.offset, item.value) for item in batch)
            )
            if cols[0]:
                arrays = [pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)]
                self._parts.append(pa.RecordBatch.from_arrays(arrays, schema=schema))

        def flush(self) -> None:
            """Write the checkpoint's rows (every topic-partition's) as one file."""
            at = time.time()
            super().flush()
            if self._parts:
                table = pa.Table.from_batches(self._parts, schema=schema)
                pq.write_table(
                    table, out / f"quix-{uuid.uuid4().hex[:12]}.parquet", compression="zstd"
                )
                self.rows += table.num_rows
                self.files += 1
                self._parts.clear()
            self.commits.append((at, seen[0] - self._committed))
            self._committed = seen[0]

    def apply(value: bytes, key: str | None, timestamp: int, headers: Any, state: State) -> Any:
        """One message: its session's change rows (the session's state read and written back)."""
        if not seen[0]:
            first_at.append(time.time())
        seen[0] += 1
        ctx.timestamp = datetime.fromtimestamp(timestamp / 1000, UTC)
        changes: list[SessionChange]
        try:
            msg = codec.decode(value, None)
            stored = state.get(STATE_KEY)
            current = SessionState() if stored is None else state_from_builtins(stored)
            changes = list(processor.process(current, msg, ctx))
            state.set(STATE_KEY, state_to_builtins(current))
        except (Violation, DecodeError):
            # restart_session: the session's table is dropped, a reset row says so.
            state.delete(STATE_KEY)
            changes = list(processor.on_reset(key or "", Violation("x", "x"), ctx))  # type: ignore[arg-type]
        return changes

    topics = topics_with_prefix(args.bootstrap, args.prefix)
    if not topics:
        raise SystemExit(f"no topic starts with {args.prefix!r}")
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=f"quix-bench-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        # Checkpoints by message count, like inorder's batches; the interval never decides.
        commit_every=args.commit_every,
        commit_interval=24 * 3600.0,
        state_dir=args.state_dir,
        # The local broker answers a fetch with the rest of every partition (as for the
        # other contenders' consumers).
        consumer_extra_config={"receive.message.max.bytes": 2147483647},
    )
    sink = ParquetChanges()
    for name in topics:
        topic = app.topic(name, key_deserializer="str", value_deserializer="bytes")
        app.dataframe(topic).apply(apply, stateful=True, metadata=True).sink(sink)
    app.run(count=args.total, timeout=args.timeout, collect=False)
    ended = time.time()
    return {
        "event": "quix",
        "quixstreams": quixstreams.__version__,
        "topics": len(topics),
        "records": seen[0],
        "rows": sink.rows,
        "files": sink.files,
        "seconds": ended - STARTED,
        "startup": first_at[0] - STARTED if first_at else None,
        "first_message": first_at[0] if first_at else None,
        "commits": sink.commits,
    }


def main() -> int:
    """Parse the arguments, run, print the JSON line; 1 if not every message was processed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True, help="the backlog's topic name prefix")
    parser.add_argument("--out", required=True, help="directory of the Parquet files")
    parser.add_argument("--state-dir", required=True, help="Quix state directory (fresh)")
    parser.add_argument("--total", type=int, required=True, help="messages in the backlog")
    parser.add_argument("--commit-every", type=int, default=100_000)
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="stop after this long without a message"
    )
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result), flush=True)
    return 0 if result["records"] == args.total else 1


if __name__ == "__main__":
    sys.exit(main())
