"""Reader-side cost of the Parquet sink's output layouts: by topic or by topic bucket.

Run: ``.venv/bin/python bench/layout_readers.py [--topics 1000] [--batches 60]
[--rows-per-topic 5] [--rounds 5] [--readers duckdb,pyarrow,spark]
[--layouts topic,bucket,topic-compacted,bucket-compacted] [--buckets 32] [--tasks 2]
[--dir DIR]`` (``INORDER_BENCH_KEEP=1`` keeps the datasets)

docs/small-files.md ("Layout for 1,000 topics at a 5 s trigger") counts the files of each
layout; this measures what a reader pays for them. The same rows are written through the
real :class:`~inorder.sinks.parquet.ParquetSink` without Spark (as ``bench/commit_growth.py``
does, but with the sink's own writer): per batch, ``--tasks`` writers (``open_writer``, one
per task of a ``local[2]`` job, the topics split between them) stage ``--rows-per-topic``
rows per topic in the session job's change-row shape (``bench/_session_rows.py``, plus
``batch_id``), then ``commit_consumed`` commits them. One more batch is staged and never
committed: the batch in flight that a reader meets between commits.

Layouts: ``topic`` (``partition_by = ["topic"]``: one file per topic per batch) and
``bucket`` (``partition_by = ["topic_bucket"]``, ``--buckets`` buckets: one file per bucket
per task), as a reader meets them within a window before compaction; ``*-compacted``: a copy
of that output after ``compact_parquet(full=True, grace_seconds=0)`` (``inorder compact
--full``: every non-final file of each partition merged; replaced files deleted at once, so
a directory reader does not see rows twice).

Queries: ``one topic`` (every column of one topic's rows, ``topic = T``); for the bucket
layouts also ``one topic + bucket`` (``topic_bucket = bucket(T) AND topic = T``, the bucket
computed with :func:`inorder.sinks.topic_bucket.topic_bucket`, as a reader would); ``scan``
(``count(*)`` and ``sum(offset)`` grouped by topic over every row).

Readers: ``duckdb`` (``read_parquet(files, hive_partitioning = true)``) and ``pyarrow``
(:func:`inorder.sinks.parquet_read.committed_dataset`: ``pyarrow.dataset`` over the files
with the committed schema's hive partitioning) read the committed file list
(:func:`~inorder.sinks.parquet_read.committed_files`, taken once per layout, outside the
timed queries; the row ``commit log / list committed files`` is its cost with the caches
cleared, to be added for a reader that loads it per query); ``spark`` (one ``local[2]``
SparkSession, ``spark.read.parquet(root)``) and the optional ``duckdb-glob``
(``read_parquet('root/*/*.parquet', hive_partitioning = true)``) and ``pyarrow-dir``
(``ds.dataset(root, partitioning="hive")``) list the directories. Before the timed rounds,
every reader's row counts are checked against the commit log (staged files invisible, the
bucket predicate correct) and the type it gives ``topic_bucket`` is printed; that pass
also warms Spark's JVM up (it is not timed).

Per (layout, reader, query): the medians over ``--rounds`` rounds (the cells in one order,
then reversed, alternating) of the wall seconds and the CPU seconds: of this process
(``time.process_time``, every thread) for DuckDB and pyarrow, of this process and its
descendants (the Spark JVM; ``bench/_process_tree.py``) for Spark. Files are warm in the
page cache after the checks: these are warm reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common
from _process_tree import tree_cpu_seconds
from _session_rows import change_schema

LAYOUTS = ("topic", "bucket", "topic-compacted", "bucket-compacted")
READERS = ("duckdb", "pyarrow", "spark", "duckdb-glob", "pyarrow-dir")
ONE, ONE_BUCKET, SCAN = "one topic", "one topic + bucket", "scan: count, sum by topic"


@dataclass(eq=False)
class Layout:
    """One built output and what a reader needs to query it."""

    name: str
    root: str
    files: list[str] = field(default_factory=list)
    """Absolute paths of the committed files."""
    state: Any = None
    """The committed :class:`~inorder.sinks.commit_log.DatasetState`."""
    megabytes: float = 0.0
    rows: int = 0

    @property
    def bucketed(self) -> bool:
        """Whether the output is partitioned by ``topic_bucket``."""
        return self.name.startswith("bucket")


def _schema() -> Any:
    import pyarrow as pa

    return change_schema().append(pa.field("batch_id", pa.int64()))


def _rows(topics: list[str], batch: int, per_topic: int) -> Any:
    """One task's rows of ``batch``: ``per_topic`` change rows per topic, offsets in order."""
    import pyarrow as pa

    n = len(topics) * per_topic
    first = batch * per_topic
    offsets = [first + i for _ in topics for i in range(per_topic)]
    ops = ("insert", "update", "update", "delete")
    columns = {
        "topic": [t for t in topics for _ in range(per_topic)],
        "partition": [0] * n,
        "offset": offsets,
        "kafka_ts": [1_800_000_000_000_000 + o * 1_000_000 for o in offsets],
        "session": [f"s-{o // 200}" for o in offsets],
        "seq": [o % 200 for o in offsets],
        "op": [ops[o % 4] for o in offsets],
        "row_id": [str(o % 40) for o in offsets],
        "row": [
            json.dumps({"id": str(o % 40), "name": f"item {o % 97}", "price": o % 1000 / 10})
            for o in offsets
        ],
        "batch_id": [batch] * n,
    }
    return pa.RecordBatch.from_pydict(columns, schema=_schema())


def build(root: str, name: str, args: argparse.Namespace, topics: list[str]) -> None:
    """Write ``--batches`` committed batches and one staged batch through the sink."""
    from inorder.sinks.base import ConsumedOffsets
    from inorder.sinks.parquet import ParquetSink

    by = ["topic_bucket"] if name == "bucket" else ["topic"]
    sink = ParquetSink(root, partition_by=by, topic_buckets=args.buckets)
    sink.bind("bench")
    schema = _schema()
    sink.check(schema)
    per = args.rows_per_topic
    for b in range(args.batches + 1):
        files = []
        for t in range(args.tasks):
            writer = sink.open_writer(schema, b, f"task-{t}")
            writer.write(_rows(topics[t :: args.tasks], b, per))
            files += writer.close()
        if b < args.batches:  # the last one stays staged: the batch in flight
            consumed = [ConsumedOffsets(tp, 0, b * per, (b + 1) * per - 1) for tp in topics]
            assert sink.commit_consumed(b, files, consumed)


def load(layout: Layout) -> None:
    """The committed files of ``layout`` (from the commit log, never by listing)."""
    from inorder.sinks.commit_log import load_state
    from inorder.storage import fs as sfs

    location = sfs.resolve(layout.root)
    layout.state = load_state(location)
    live = list(layout.state.files.values())
    layout.files = [location.join(f.path) for f in live]
    layout.megabytes = sum(f.size_bytes for f in live) / 1e6
    layout.rows = sum(f.rows for f in live)


def list_committed(layout: Layout) -> int:
    """``committed_files`` as a fresh reader process pays it (the commit log's caches cleared)."""
    from inorder.sinks import commit_log
    from inorder.sinks.parquet_read import committed_files

    for cache in (
        commit_log._MANIFEST_CACHE,
        commit_log._CHECKPOINT_CACHE,
        commit_log._FILES_CACHE,
    ):
        cache.clear()
    return len(committed_files(layout.root))


# -- readers: each query returns the rows it read (one topic) or counted (scan) -----------------


def duck_source(layout: Layout, glob: bool) -> tuple[str, dict[str, Any]]:
    """DuckDB's ``read_parquet`` of the committed list (a bound parameter: cheaper than the
    list as a SQL literal) or of a glob over the partition directories; its parameters."""
    if glob:
        depth = "/".join(["*"] * (len(layout.state.partition_by) + 1))
        return f"read_parquet('{layout.root}/{depth}.parquet', hive_partitioning = true)", {}
    return "read_parquet($files, hive_partitioning = true)", {"files": layout.files}


def duckdb_query(con: Any, layout: Layout, glob: bool, query: str, topic: str, bucket: int) -> int:
    """One query through DuckDB."""
    source, params = duck_source(layout, glob)
    if query == SCAN:
        sql = f'SELECT topic, count(*) AS n, sum("offset") AS s FROM {source} GROUP BY topic'
        return int(sum(r[1] for r in con.execute(sql, params).fetchall()))
    where = f"topic = '{topic}'"
    if query == ONE_BUCKET:
        where = f"topic_bucket = {bucket} AND {where}"
    return len(con.execute(f"SELECT * FROM {source} WHERE {where}", params).fetchall())


def arrow_dataset(layout: Layout, directory: bool) -> Any:
    """The pyarrow dataset: the committed files, or discovered by listing the root."""
    import pyarrow.dataset as ds

    from inorder.sinks.parquet_read import committed_dataset
    from inorder.storage import fs as sfs

    if directory:
        return ds.dataset(layout.root, format="parquet", partitioning="hive")
    return committed_dataset(sfs.resolve(layout.root), layout.state)


def pyarrow_query(dataset: Any, query: str, topic: str, bucket: int) -> int:
    """One query through ``pyarrow.dataset``."""
    import pyarrow.dataset as ds

    if query == SCAN:
        table = dataset.to_table(columns=["topic", "offset"])
        agg = table.group_by("topic").aggregate([("offset", "count"), ("offset", "sum")])
        return int(sum(agg.column("offset_count").to_pylist()))
    expr = ds.field("topic") == topic
    if query == ONE_BUCKET:
        expr = (ds.field("topic_bucket") == bucket) & expr
    return int(dataset.to_table(filter=expr).num_rows)


def spark_session() -> Any:
    """One ``local[2]`` SparkSession for every Spark query (UI off, errors only)."""
    common.setup_env()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("layout-readers")
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_query(spark: Any, layout: Layout, query: str, topic: str, bucket: int) -> int:
    """One query through Spark: ``spark.read.parquet`` of the root (it lists the directories)."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(layout.root)
    if query == SCAN:
        rows = df.groupBy("topic").agg(F.count("*").alias("n"), F.sum("offset")).collect()
        return int(sum(r["n"] for r in rows))
    cond = F.col("topic") == topic
    if query == ONE_BUCKET:
        cond = (F.col("topic_bucket") == bucket) & cond
    return len(df.filter(cond).collect())


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Readers:
    """What the queries share: the engines, the topic a reader wants and its bucket."""

    spark: Any
    duck: Any
    topic: str
    bucket: int

    def query(self, layout: Layout, reader: str, query: str) -> int:
        """Run one query; the rows it read or counted."""
        topic, bucket = self.topic, self.bucket
        if reader == "commit log":
            return list_committed(layout)
        if reader.startswith("duckdb"):
            glob = reader == "duckdb-glob"
            return duckdb_query(self.duck, layout, glob, query, topic, bucket)
        if reader.startswith("pyarrow"):
            dataset = arrow_dataset(layout, reader == "pyarrow-dir")
            return pyarrow_query(dataset, query, topic, bucket)
        return spark_query(self.spark, layout, query, topic, bucket)

    def bucket_type(self, layout: Layout, reader: str) -> str:
        """The type ``reader`` gives the ``topic_bucket`` column."""
        if reader.startswith("duckdb"):
            source, params = duck_source(layout, reader == "duckdb-glob")
            sql = f"SELECT typeof(topic_bucket) FROM {source} LIMIT 1"
            return str(self.duck.execute(sql, params).fetchall()[0][0])
        if reader.startswith("pyarrow"):
            schema = arrow_dataset(layout, reader == "pyarrow-dir").schema
            return str(schema.field("topic_bucket").type)
        return str(self.spark.read.parquet(layout.root).schema["topic_bucket"].dataType)


@dataclass
class Cell:
    """One (layout, reader, query) and its measurements."""

    layout: Layout
    reader: str
    query: str
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)

    def measure(self, readers: Readers) -> None:
        """Run once; wall and CPU seconds appended (Spark: this process and the JVM)."""
        tree = self.reader == "spark"
        me = os.getpid()
        c0 = tree_cpu_seconds(me) if tree else time.process_time()
        w0 = time.perf_counter()
        readers.query(self.layout, self.reader, self.query)
        self.walls.append(time.perf_counter() - w0)
        self.cpus.append((tree_cpu_seconds(me) if tree else time.process_time()) - c0)


def stats_candidates(layout: Layout, topic: str) -> str:
    """Files whose ``topic`` row-group statistics may hold ``topic`` (no bucket predicate)."""
    import pyarrow.parquet as pq

    hits = 0
    for path in layout.files:
        meta = pq.ParquetFile(path).metadata
        col = meta.schema.names.index("topic")
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(col).statistics
            if st is None or not st.has_min_max or st.min <= topic <= st.max:
                hits += 1
                break
    return f"{hits} of {len(layout.files)}"


def make_layout(work: str, name: str, args: argparse.Namespace, topics: list[str]) -> Layout:
    """Build (or copy and compact) one layout; print what it holds."""
    from inorder.sinks.compaction import compact_parquet

    root = os.path.join(work, name)
    base = name.removesuffix("-compacted")
    started = time.perf_counter()
    if name == base:
        build(root, name, args, topics)
        what = "built"
    else:
        src = os.path.join(work, base)
        if not os.path.isdir(src):
            build(src, base, args, topics)
        shutil.copytree(src, root)
        # grace 0: the replaced files go at once (a directory reader would see rows twice)
        report = compact_parquet(root, full=True, grace_seconds=0)
        what = f"copied and compacted (full=True: {report.summary()})"
    layout = Layout(name, root)
    load(layout)
    staged = sum(1 for _ in Path(root, "_inorder", "staging").rglob("*.staged"))
    print(
        f"{name}: {what} in {time.perf_counter() - started:.1f} s; "
        f"{len(layout.files):,} committed files, {layout.megabytes:.2f} MB, "
        f"{layout.rows:,} rows; {staged} staged files of the uncommitted batch",
        flush=True,
    )
    return layout


def check(grid: list[Cell], readers: Readers, names: list[str], per_topic: int) -> None:
    """Untimed: every query's rows against the commit log; how readers type the bucket."""
    failed = 0
    for cell in grid:
        want = cell.layout.rows if cell.query == SCAN else per_topic
        if cell.reader == "commit log":
            want = len(cell.layout.files)
        got = readers.query(cell.layout, cell.reader, cell.query)
        if got != want:
            failed += 1
            print(f"CHECK FAILED: {cell.layout.name} / {cell.reader} / {cell.query}: ", end="")
            print(f"{got:,} rows, want {want:,}")
    print(f"checks: {len(grid) - failed} of {len(grid)} queries read the committed rows exactly")
    for layout in dict.fromkeys(c.layout for c in grid if c.layout.bucketed):
        types = ", ".join(f"{r} {readers.bucket_type(layout, r)}" for r in names)
        print(f"{layout.name}: topic_bucket (committed as int32) read as: {types}")
        admit = stats_candidates(layout, readers.topic)
        print(f"{layout.name}: files whose topic statistics admit {readers.topic!r}: {admit}")
    print(flush=True)


def shell(argv: list[str]) -> str:
    """A command's output (one line), or why not."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"({argv[0]}: {exc})"


def parse_args() -> argparse.Namespace:
    """The command line (``--readers`` and ``--layouts`` as lists)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--rows-per-topic", type=int, default=5, help="per topic per batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--readers", default="duckdb,pyarrow,spark", help=", ".join(READERS))
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=", ".join(LAYOUTS))
    parser.add_argument("--buckets", type=int, default=32, help="topic_buckets (bucket layout)")
    parser.add_argument("--tasks", type=int, default=2, help="writers per batch")
    parser.add_argument("--dir", help="where the datasets go (default: the temp directory)")
    args = parser.parse_args()
    args.readers = [r for r in args.readers.split(",") if r]
    args.layouts = [x for x in args.layouts.split(",") if x]
    for value, known, flag in (
        (args.readers, READERS, "--readers"),
        (args.layouts, LAYOUTS, "--layouts"),
    ):
        if unknown := sorted(set(value) - set(known)):
            parser.error(f"{flag}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return args


def main() -> int:
    args = parse_args()
    print(f"`python bench/layout_readers.py {' '.join(sys.argv[1:])}`")
    print(f"start: {shell(['date', '-u'])}; {shell(['uptime'])}")
    print(f"{common.machine()}; {common.versions()}", flush=True)
    import duckdb

    from inorder.sinks.topic_bucket import topic_bucket

    topics = [f"site-{t:04d}" for t in range(args.topics)]
    topic = topics[len(topics) // 2]
    readers = Readers(None, duckdb.connect(), topic, topic_bucket(topic, args.buckets))
    work = tempfile.mkdtemp(prefix="layout-readers-", dir=args.dir)
    try:
        layouts = [make_layout(work, name, args, topics) for name in args.layouts]
        if "spark" in args.readers:
            started = time.perf_counter()
            readers.spark = spark_session()
            print(f"SparkSession local[2] started in {time.perf_counter() - started:.1f} s")
        print(f"\none topic: {topic!r}, bucket {readers.bucket} of {args.buckets}; ", end="")
        print(f"duckdb {duckdb.__version__}")
        grid: list[Cell] = []
        for x in layouts:
            queries = [ONE_BUCKET, ONE, SCAN] if x.bucketed else [ONE, SCAN]
            grid.append(Cell(x, "commit log", "list committed files"))
            grid += [Cell(x, r, q) for r in args.readers for q in queries]
        check(grid, readers, args.readers, args.batches * args.rows_per_topic)
        for round_no in range(args.rounds):
            started = time.perf_counter()
            for cell in grid if round_no % 2 == 0 else grid[::-1]:
                cell.measure(readers)
            took = time.perf_counter() - started
            print(f"round {round_no + 1}: {took:.1f} s; {shell(['uptime'])}", flush=True)
        headers = ["layout", "files", "MB", "reader", "query", "wall s median", "CPU s median"]
        rows = [
            [c.layout.name, f"{len(c.layout.files):,}", f"{c.layout.megabytes:.2f}", c.reader,
             c.query, f"{statistics.median(c.walls):.3f}", f"{statistics.median(c.cpus):.3f}"]
            for c in grid
        ]  # fmt: skip
        print(f"\n{common.table(headers, rows, right=(1, 2, 5, 6))}\n")
        print(
            f"{args.topics} topics x {args.batches} batches x {args.rows_per_topic} rows per "
            f"topic, {args.tasks} writers per batch; medians of {args.rounds} rounds"
        )
    finally:
        if readers.spark is not None:
            readers.spark.stop()
        if os.environ.get("INORDER_BENCH_KEEP"):
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"end: {shell(['date', '-u'])}; {shell(['uptime'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
