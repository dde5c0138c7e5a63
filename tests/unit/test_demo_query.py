"""The query the demo prints runs as printed: no DuckDB command line tool is installed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pyarrow as pa

from inorder.demo import query_command
from inorder.sinks.parquet import ParquetSink

SCHEMA = pa.schema([("topic", pa.string()), ("op", pa.string()), ("offset", pa.int64())])


def test_the_printed_query_runs_in_a_shell(tmp_path: Path) -> None:
    output = tmp_path / "demo output"
    sink = ParquetSink(str(output), partition_by=["topic"])
    sink.check(SCHEMA)
    writer = sink.open_writer(SCHEMA, 0, "t0")
    writer.write(
        pa.record_batch(
            [
                pa.array(["site-000", "site-000", "site-001"]),
                pa.array(["clear", "insert", "end"]),
                pa.array([0, 1, 2]),
            ],
            schema=SCHEMA,
        )
    )
    assert sink.commit(0, writer.close())
    command = query_command(output.resolve())
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "site-0" in line]
    assert len(rows) == 3 and re.search(r"insert\s*│\s*1\s*│", rows[1]), done.stdout
