"""The engine's applier against a bare loop, on real session messages, CPU per record.

Run: ``.venv/bin/python bench/apply_vs_bare.py [--messages 200000] [--rounds 5]``

One partition of simulated session traffic is produced to the local broker and read once into
memory (the record tuples the engine's task hands its applier). Then, alternating, in this
process (garbage collection paused in both, as in the engine's task):

* **bare**: decode with ``SessionCodec``, ``SessionTables.process`` with dict state, the change
  rows appended to column lists (the one-process limit's loop without Kafka and Parquet);
* **applier**: ``OrderedApplier`` with the same processor and codec, the strict tier with
  ``restart_session`` (the ``examples/sessions.toml`` settings), every row checked against the
  output schema, per-key entries, offsets and counters;
* **encode**: the applier's rows to an Arrow batch with ``RowEncoder.encode_with_origin``.

Prints the medians of the CPU seconds per record (``time.process_time``).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common


def _read_backlog(messages: int) -> list[tuple[Any, ...]]:
    from inorder.kafka.consumer import read_records
    from inorder.kafka.options import parse_options
    from inorder.records import TopicPartition

    with common.workdir("apply-vs-bare") as tmp, common.broker(tmp) as bootstrap:
        prefix = f"avb{os.urandom(3).hex()}-"
        common.simulate_backlog(bootstrap, prefix, messages, sites=1, partitions=1)
        options = parse_options(
            {"kafka.bootstrap.servers": bootstrap, "subscribePattern": prefix + ".*"}
        )
        tp = TopicPartition(prefix + "000", 0)
        return [r for chunk in read_records(options, tp, 0, messages) for r in chunk]


def _bare(records: list[tuple[Any, ...]]) -> int:
    from _session_rows import SessionContext

    from inorder.codecs.base import DecodeError
    from inorder.processor import Violation
    from inorder.sessions.messages import SessionCodec
    from inorder.sessions.processor import SessionState, SessionTables

    processor = SessionTables(row_key="id")
    codec = SessionCodec("id")
    states: dict[str, SessionState] = {}
    ctx = SessionContext()
    columns: list[list[Any]] = [[] for _ in range(9)]
    for offset, _key, value, ts_us, _headers in records:
        ctx.timestamp = datetime.fromtimestamp(ts_us / 1e6, UTC)
        try:
            msg = codec.decode(value, None)
            state = states.get(msg.session) or SessionState()
            changes = list(processor.process(state, msg, ctx))
            states[msg.session] = state
        except (Violation, DecodeError):
            continue
        topic, partition, offset_, ts, session, seq, op, row_id, row = columns
        for c in changes:
            topic.append("t")
            partition.append(0)
            offset_.append(offset)
            ts.append(c.kafka_ts)
            session.append(c.session)
            seq.append(c.seq)
            op.append(c.op)
            row_id.append(c.row_id)
            row.append(c.row)
    return len(columns[0])


class _NoState:
    """A state view with nothing stored (a first batch)."""

    def load(self, key: str) -> None:
        return None

    def timers_after(self, kind: int, after: Any, limit: int) -> list[tuple[int, str]]:
        return []


def _applier(records: list[tuple[Any, ...]]) -> Any:
    from inorder.engine.apply import OrderedApplier
    from inorder.integrity import Integrity
    from inorder.sessions.messages import SessionCodec
    from inorder.sessions.processor import SessionState, SessionTables
    from inorder.state.codec import StateCodec
    from inorder.state.entry import PartitionMeta

    applier = OrderedApplier(
        SessionTables(row_key="id"),
        SessionCodec("id"),
        Integrity.strict(on_violation="restart_session"),
        _NoState(),
        "t",
        0,
        1,
        datetime(2026, 1, 1, tzinfo=UTC),
        PartitionMeta(),
        copy_state=StateCodec(SessionState).copy,
    )
    applier.apply(records)
    return applier


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    common.setup_env()
    from inorder.schema import RowEncoder
    from inorder.sessions.processor import SessionChange

    records = _read_backlog(args.messages)
    encoder = RowEncoder(SessionChange)
    times: dict[str, list[float]] = {"bare": [], "applier": [], "encode": []}
    for _ in range(args.rounds):
        gc.collect()
        gc.disable()
        started = time.process_time()
        bare_rows = _bare(records)
        times["bare"].append(time.process_time() - started)
        started = time.process_time()
        applier = _applier(records)
        times["applier"].append(time.process_time() - started)
        started = time.process_time()
        encoder.encode_with_origin(applier.rows, "t", 0, applier.row_offsets, 1)
        times["encode"].append(time.process_time() - started)
        gc.enable()
        if bare_rows != len(applier.rows):
            raise SystemExit(f"bare loop made {bare_rows} rows, the applier {len(applier.rows)}")
    n = len(records)
    print(f"{n:,} records, {bare_rows:,} change rows, {args.rounds} rounds, load {os.getloadavg()}")
    for name, values in times.items():
        print(f"{name:8s} {statistics.median(values) / n * 1e6:5.2f} µs CPU/record (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
