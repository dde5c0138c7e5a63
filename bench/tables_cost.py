"""What the current and history session tables add to a micro-batch (docs/tables.md).

Two outputs get the same change rows, batch after batch, alternating: the change log alone
(its staged write and commit, as the driver does at the end of a batch), and the change log
followed by ``SessionTablesWriter.after_commit`` keeping both tables. Prints the median time
per batch of each (the tables' step also in CPU seconds of the process) and the ratio.
Without Spark and Kafka: this is the part of a batch the tables change; a real batch also
spends time reading and applying records, so the ratio against a whole batch is lower than
the one printed.

    .venv/bin/python bench/tables_cost.py --batches 8 --changes 100000
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from inorder.schema import output_schema
from inorder.sessions import SessionChange, SessionTables
from inorder.sessions.tables_writer import SessionTablesWriter, TableOutputs
from inorder.sinks.base import Sink
from inorder.sinks.parquet import ParquetSink

SCHEMA = output_schema(SessionChange)


class Generator:
    """Session change rows: mostly updates and inserts, some deletes, snapshots and ends."""

    def __init__(self, sessions: int, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.rows: list[dict[str, str]] = [{} for _ in range(sessions)]
        self.offsets = [0] * 4
        self.n = 0

    def batch(self, batch_id: int, changes: int) -> pa.Table:
        cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
        rng = self.rng

        def emit(s: int, op: str, rid: str | None = None, row: str | None = None) -> None:
            part = s % 4
            for name, value in (
                ("topic", "site-000"),
                ("partition", part),
                ("offset", self.offsets[part]),
                ("kafka_ts", None),
                ("session", f"s{s:05d}"),
                ("seq", 0),
                ("op", op),
                ("row_id", rid),
                ("row", row),
                ("batch_id", batch_id),
            ):
                cols[name].append(value)

        while len(cols["op"]) < changes:
            s = rng.randrange(len(self.rows))
            rows = self.rows[s]
            self.offsets[s % 4] += 1
            roll = rng.random()
            self.n += 1
            if not rows or roll < 0.01:
                rows.clear()
                emit(s, "clear")
                for k in range(20):
                    rows[f"r{k}"] = msgspec.json.encode({"id": f"r{k}", "v": self.n}).decode()
                    emit(s, "insert", f"r{k}", rows[f"r{k}"])
            elif roll < 0.3:
                rid = f"r{rng.randrange(10**6)}"
                rows[rid] = msgspec.json.encode({"id": rid, "v": self.n}).decode()
                emit(s, "insert", rid, rows[rid])
            elif roll < 0.9:
                rid = rng.choice(list(rows))
                rows[rid] = msgspec.json.encode({"id": rid, "v": self.n}).decode()
                emit(s, "update", rid, rows[rid])
            else:
                rid = rng.choice(list(rows))
                del rows[rid]
                emit(s, "delete", rid)
        return pa.table(cols, schema=SCHEMA)


def commit(sink: Sink, batch_id: int, table: pa.Table) -> None:
    """Stage and commit one batch of change rows, as the engine and the driver do."""
    writer = sink.open_writer(table.schema, batch_id, f"bench-{batch_id}")
    for batch in table.to_batches(max_chunksize=65536):
        writer.write(batch)
    sink.commit(batch_id, writer.close())


def main() -> None:
    """Run the comparison and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tables-cost-") as tmp:
        root = Path(tmp)
        alone = ParquetSink(str(root / "alone"), partition_by=["topic"])
        logged = ParquetSink(str(root / "logged"), partition_by=["topic"])
        for sink in (alone, logged):
            sink.check(SCHEMA)
        outputs = TableOutputs(current=str(root / "current"), history=str(root / "history"))
        tables = SessionTablesWriter(SessionTables(), logged, outputs)
        tables.check()
        gen = Generator(args.sessions)
        times: dict[str, list[float]] = {
            "change log": [],
            "with tables": [],
            "tables": [],
            "tables cpu": [],
        }
        for b in range(args.batches):
            table = gen.batch(b, args.changes)
            started = time.perf_counter()
            commit(alone, b, table)
            times["change log"].append(time.perf_counter() - started)
            started = time.perf_counter()
            commit(logged, b, table)
            # CPU time of the whole process (delta-rs threads included): steadier than the
            # wall clock on a shared machine.
            cpu = time.process_time()
            report = tables.after_commit(b)
            times["tables cpu"].append(time.process_time() - cpu)
            times["with tables"].append(time.perf_counter() - started)
            times["tables"].append(report.seconds)
            print(
                f"batch {b}: {table.num_rows} changes, change log "
                f"{times['change log'][-1]:.2f} s, with tables {times['with tables'][-1]:.2f} s "
                f"(tables {times['tables'][-1]:.2f} s, {times['tables cpu'][-1]:.2f} s CPU), "
                f"load {os.getloadavg()[0]:.2f}"
            )
        medians = {k: statistics.median(v) for k, v in times.items()}
        for name, value in medians.items():
            print(f"median {name}: {value:.3f} s")
        print(f"tables add {medians['tables'] / medians['change log']:.0%} to the commit")


if __name__ == "__main__":
    main()
