"""Spark's stateful operator loses offset order when its sort spills; both backends do not.

``applyInPandasWithState`` (no sort of our own in the function) is run in a subprocess with a
SparkSession that forces the shuffle sort to spill every few hundred rows
(``spark.shuffle.spill.numElementsForceSpillThreshold``): rows of one key then reach the
function out of offset order. The partition backend, on the same records, sees every key's
records in offset order; so does the Spark backend (``transformWithState`` under the same
forced spills), whose group function checks and stably re-sorts what Spark delivers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tests.property.procs import MsgCodec, Tallier, record, register_for_spark

from inorder.engine.partition import PartitionBackend
from inorder.integrity import Integrity
from inorder.sinks.parquet import ParquetSink, committed_files
from inorder.testing.memory import records_dataframe

N_RECORDS = 8_000
KEYS = 4

VANILLA = r"""
import json, os, sys
import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.streaming.state import GroupStateTimeout

src, ckpt, out = sys.argv[1:4]
spark = (SparkSession.builder.master("local[2]").appName("vanilla-order")
         .config("spark.ui.enabled", "false")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.shuffle.spill.numElementsForceSpillThreshold", "200")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = spark.readStream.schema("k string, offset long").parquet(src)

def check(key, pdfs, state):
    # The function sees the rows of one key in the order Spark delivers them.
    last = state.get[0] if state.exists else -1
    disorder = 0
    n = 0
    for pdf in pdfs:
        for off in pdf["offset"].tolist():
            if off < last:
                disorder += 1
            last = max(last, off)
            n += 1
    state.update((last,))
    yield pd.DataFrame({"k": [key[0]], "n": [n], "disorder": [disorder]})

q = (df.groupBy("k")
     .applyInPandasWithState(check, "k string, n long, disorder long", "last long", "append",
                             GroupStateTimeout.NoTimeout)
     .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
     .outputMode("append").trigger(availableNow=True).start())
q.awaitTermination()
res = spark.read.parquet(out).groupBy().sum("n", "disorder").collect()[0]
print(json.dumps({"rows": int(res[0]), "disorder": int(res[1])}))
spark.stop()
"""


def _records() -> list[Any]:
    return [record(i, f"k{i % KEYS}", v=i % 7, t=float(i)) for i in range(N_RECORDS)]


def test_vanilla_apply_in_pandas_with_state_misorders_when_sorts_spill(tmp_path: Path) -> None:
    import pyarrow as pa

    src = tmp_path / "src"
    src.mkdir()
    rows = _records()
    # Several input files: several map tasks feed each key as well.
    for part in range(4):
        chunk = rows[part * N_RECORDS // 4 : (part + 1) * N_RECORDS // 4]
        pq.write_table(
            pa.table({"k": [r.key.decode() for r in chunk], "offset": [r.offset for r in chunk]}),
            src / f"part-{part}.parquet",
        )
    script = tmp_path / "vanilla.py"
    script.write_text(VANILLA)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(script), str(src), str(tmp_path / "ckpt"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rows"] == N_RECORDS
    assert result["disorder"] > 0, "expected Spark to misorder rows of a key after spills"


def test_partition_backend_keeps_offset_order(spark: Any, tmp_path: Path) -> None:
    register_for_spark()
    backend = PartitionBackend(
        Tallier(),
        MsgCodec(),
        Integrity.strict(),
        checkpoint=str(tmp_path / "ckpt"),
        sink=ParquetSink(str(tmp_path / "out")),
    )
    report = backend.run_batch(records_dataframe(spark, _records()), 0)
    assert report.records == N_RECORDS
    last: dict[str, int] = {}
    n = 0
    for f in committed_files(str(tmp_path / "out")):
        for row in pq.read_table(str(tmp_path / "out" / f.path)).to_pylist():
            if row["kind"] != "add":
                continue
            assert row["offset"] > last.get(row["k"], -1)
            assert row["n"] == row["offset"] // KEYS + 1  # n-th record of its key, in order
            last[row["k"]] = row["offset"]
            n += 1
    assert n == N_RECORDS


SPARK_BACKEND = r"""
import json, sys, tempfile
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from inorder.pipeline.spark import build_spark_session
from inorder.engine.spark_backend import SparkBackend
from inorder.testing.replay import ReplayRun
from inorder.integrity import Integrity
from inorder.records import TopicPartition
from inorder.sinks.parquet import ParquetSink
from tests.property.procs import MsgCodec, Tallier, record, register_for_spark

register_for_spark()
work = Path(sys.argv[1])
spark = build_spark_session(
    "local[2]", "tws-order", conf={"spark.shuffle.spill.numElementsForceSpillThreshold": "200"}
)
backend = SparkBackend(
    Tallier(), MsgCodec(), Integrity.strict(), checkpoint=str(work / "ckpt"),
    sink=ParquetSink(str(work / "out")), key_groups=2, shuffle_partitions=2,
)
n, keys = int(sys.argv[3]), int(sys.argv[4])
records = [record(i, f"k{i % keys}", v=i % 7, t=float(i)) for i in range(n)]
run = ReplayRun(spark, backend, work / "run", [TopicPartition("t", 0)])
report = run.step(records)
run.stop()
resorted = sum(p.timings.get("resorted", 0.0) for p in report.partitions)
print(json.dumps({"records": report.records, "resorted": resorted}))
spark.stop()
"""


def test_spark_backend_keeps_offset_order_when_sorts_spill(tmp_path: Path) -> None:
    """transformWithState after a spilling sort: the group function re-sorts, output in order."""
    script = tmp_path / "tws_order.py"
    script.write_text(SPARK_BACKEND)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(root), str(N_RECORDS), str(KEYS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
        cwd=str(root),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["records"] == N_RECORDS
    # Spark delivered some group's rows out of offset order: the check + stable sort fixed it.
    assert result["resorted"] > 0, "expected Spark to misorder rows of a group after spills"
    last: dict[str, int] = {}
    n = 0
    for f in committed_files(str(tmp_path / "out")):
        for row in pq.read_table(str(tmp_path / "out" / f.path)).to_pylist():
            if row["kind"] != "add":
                continue
            assert row["n"] == row["offset"] // KEYS + 1  # n-th record of its key, in order
            last[row["k"]] = max(last.get(row["k"], -1), row["offset"])
            n += 1
    assert n == N_RECORDS
