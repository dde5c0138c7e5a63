"""inorder's session tables and Spark 4.3's AutoCDC on the same Debezium input (docs/autocdc.md).

The same PostgreSQL Debezium events, cut into the same micro-batches, go through:

* inorder: ``SessionTables(envelope=Debezium())`` through the engine's reference runner (the
  ordered apply of a partition task, without Spark and Kafka), the change log committed to a
  Parquet sink, then ``SessionTablesWriter.after_commit`` keeping the current and history
  tables as Delta tables (deltalake), as the driver does after each batch;
* AutoCDC: a Spark Declarative Pipeline (``pyspark.pipelines``) reading the events as JSON
  text files (one file per micro-batch), with an SCD1 flow and an SCD2 flow, keys ``id``,
  ``sequence_by`` the event's ``source.lsn`` (or ``--sequence offset``: the record's offset).

Spark ships no table that supports MERGE, and AutoCDC refuses any other target
(``AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE``); Delta's and Iceberg's Spark runtimes are Maven
jars these machines cannot fetch. So the AutoCDC targets here are in a small in-memory
catalog compiled at run time (``MemCatalog`` below: copy-on-write MERGE over rows held in
the JVM): the AutoCDC time includes no file I/O, inorder's does (Delta files on local disk).

Prints both final tables against the source table the events describe, the history tables'
versions, and the wall time of each side. Needs ``javac`` (Java 17) and, for the pipeline, a
Python with ``pyspark[pipelines]`` (grpcio, grpcio-status): ``--sdp-python``.

    .venv/bin/python bench/autocdc_vs_inorder.py --scenario worked --sdp-python /tmp/sdp/bin/python
    .venv/bin/python bench/autocdc_vs_inorder.py --scenario random --events 20000 --batches 4 \
        --sdp-python /tmp/sdp/bin/python
"""

# The Java source of MemCatalog below keeps its own line lengths.
# ruff: noqa: E501

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

TOPIC = "shop.inventory.customers"
SOURCE = {"connector": "postgresql", "db": "shop", "schema": "inventory", "table": "customers"}

Event = dict[str, Any] | None  # None: a Debezium tombstone (null value)


def event(op: str, lsn: int, before: Any = None, after: Any = None, snap: str = "false") -> Event:
    """A Debezium PostgreSQL change event (schemaless JSON converter form)."""
    src: dict[str, Any] = {**SOURCE, "snapshot": snap, "lsn": lsn}
    if snap == "false":  # streamed: the position inorder checks ([last committed LSN, LSN])
        src["sequence"] = json.dumps([str(lsn - lsn % 1000), str(lsn)])
    return {"op": op, "before": before, "after": after, "source": src, "ts_ms": lsn}


def worked() -> tuple[list[list[Event]], dict[int, dict[str, Any]]]:
    """The example of docs/autocdc.md: redelivery, truncate, re-snapshot; two batches."""
    r = lambda i, n, lsn, s: event("r", lsn, after={"id": i, "name": n}, snap=s)  # noqa: E731
    u = lambda i, n, lsn: event("u", lsn, before={"id": i}, after={"id": i, "name": n})  # noqa: E731
    first = [
        r(1, "a", 50, "first"), r(2, "b", 50, "true"), r(3, "c", 50, "last"),
        u(1, "a2", 110), u(1, "a3", 115),
        event("d", 210, before={"id": 2}), None,
    ]  # fmt: skip
    second = [
        *first[3:7],  # connector restart: re-sent from its last flushed offset
        event("t", 410),
        event("c", 510, after={"id": 5, "name": "e"}),
        event("c", 520, after={"id": 7, "name": "g"}),
        r(5, "e", 600, "first"), r(6, "f", 600, "last"),  # slot lost: a new snapshot
    ]  # fmt: skip
    return [first, second], {5: {"id": 5, "name": "e"}, 6: {"id": 6, "name": "f"}}


def generated(
    events: int, rows: int, batches: int, seed: int = 1
) -> tuple[list[list[Event]], dict[int, dict[str, Any]]]:
    """A snapshot of ``rows`` rows, then inserts, updates and deletes with rising LSNs, and one
    connector restart in the middle re-sending the last 500 events. No truncate, no re-snapshot:
    input AutoCDC's rules fit."""
    rng = random.Random(seed)
    table: dict[int, dict[str, Any]] = {}
    out: list[Event] = []
    for i in range(rows):
        table[i] = {"id": i, "name": f"n{i}", "qty": 0}
        snap = "first" if i == 0 else "last" if i == rows - 1 else "true"
        out.append(event("r", 100, after=table[i], snap=snap))
    lsn, next_id, restart_at = 1000, rows, events // 2
    while len(out) < events:
        lsn += rng.randrange(1, 50)
        roll = rng.random()
        if roll < 0.15 or not table:
            table[next_id] = {"id": next_id, "name": f"n{next_id}", "qty": 0}
            out.append(event("c", lsn, after=table[next_id]))
            next_id += 1
        elif roll < 0.9:
            rid = rng.choice(list(table))
            table[rid] = {**table[rid], "qty": table[rid]["qty"] + 1, "name": f"v{lsn}"}
            out.append(event("u", lsn, before={"id": rid}, after=table[rid]))
        else:
            rid = rng.choice(list(table))
            del table[rid]
            out.append(event("d", lsn, before={"id": rid}))
            out.append(None)
        if len(out) >= restart_at > 0:
            out.extend(out[-500:])
            restart_at = 0
    size = -(-len(out) // batches)
    return [out[i : i + size] for i in range(0, len(out), size)], table


# ---------------------------------------------------------------------------------- inorder


def run_inorder(batches: list[list[Event]], work: Path) -> dict[str, Any]:
    """Apply, commit the change log, keep the Delta tables; per batch, as the driver does."""
    from deltalake import DeltaTable

    from inorder.engine.reference import ReferenceRunner
    from inorder.integrity import Integrity
    from inorder.records import KafkaRecord
    from inorder.schema import output_schema
    from inorder.sessions import Debezium, SessionChange, SessionTables
    from inorder.sessions.tables_writer import SessionTablesWriter, TableOutputs
    from inorder.sinks.parquet import ParquetSink

    proc = SessionTables(envelope=Debezium())
    runner = ReferenceRunner(proc, proc.default_codec(), Integrity.strict())
    log = ParquetSink(str(work / "changes"), partition_by=["topic"])
    schema = output_schema(SessionChange)
    log.check(schema)
    tables = SessionTablesWriter(
        proc, log, TableOutputs(current=str(work / "current"), history=str(work / "history"))
    )
    tables.check()
    when, offset, seconds, duplicates = datetime(2026, 1, 1, tzinfo=UTC), 0, 0.0, 0
    for b, evs in enumerate(batches):
        recs = []
        for ev in evs:
            value = None if ev is None else msgspec.json.encode(ev)
            recs.append(KafkaRecord(TOPIC, 0, offset, b'{"id":0}', value, when))
            offset += 1
        started = time.perf_counter()
        out = runner.run_batch(recs, b, when)
        duplicates += out.counters.get("duplicates", 0)
        rows = pa.Table.from_pylist(out.rows, schema=schema)
        writer = log.open_writer(schema, b, f"bench-{b}")
        for chunk in rows.to_batches(max_chunksize=65536):
            writer.write(chunk)
        log.commit(b, writer.close())
        tables.after_commit(b)
        seconds += time.perf_counter() - started
    current = DeltaTable(str(work / "current")).to_pyarrow_table().to_pylist()
    history = DeltaTable(str(work / "history")).to_pyarrow_table().to_pylist()
    return {
        "seconds": seconds,
        "duplicates": duplicates,
        "current": {int(r["row_id"]): json.loads(r["row"]) for r in current},
        "versions": len(history),
        "open": sum(1 for r in history if r["is_current"]),
    }


# ---------------------------------------------------------------------------------- AutoCDC

FLOWS = """
from pyspark import pipelines as dp
from pyspark.sql import functions as F

ROW = "STRUCT<id: BIGINT, name: STRING, qty: BIGINT>"
EVENT = (f"op STRING, before {ROW}, after {ROW}, "
         "source STRUCT<lsn: BIGINT, snapshot: STRING>")

@dp.temporary_view
def changes():
    lines = (spark.readStream.format("text").option("maxFilesPerTrigger", 1)
             .load(INPUT))
    ev = F.from_json(F.split(F.col("value"), "\\t").getItem(1), EVENT)
    return (lines
        .select(F.split(F.col("value"), "\\t").getItem(0).cast("bigint").alias("offset"),
                ev.alias("e"))
        .where("e IS NOT NULL AND e.op IN ('r', 'c', 'u', 'd')")  # no tombstones, truncates
        .select(F.coalesce("e.after.id", "e.before.id").alias("id"),
                F.col("e.after.name").alias("name"), F.col("e.after.qty").alias("qty"),
                F.col("e.op").alias("op"), F.col("e.source.lsn").alias("lsn"), "offset"))

for target, scd in (("current_t", 1), ("history_t", 2)):
    dp.create_streaming_table(target)
    dp.create_auto_cdc_flow(target=target, source="changes", keys=["id"],
                            sequence_by=SEQUENCE, apply_as_deletes="op = 'd'",
                            except_column_list=["op", "lsn", "offset"],
                            stored_as_scd_type=scd)
"""

DRIVER = """
import json, sys, time
from pathlib import Path
from pyspark.sql import SparkSession
from pyspark.pipelines.cli import load_pipeline_spec, register_definitions
from pyspark.pipelines.spark_connect_graph_element_registry import (
    SparkConnectGraphElementRegistry)
from pyspark.pipelines.spark_connect_pipeline import (
    create_dataflow_graph, handle_pipeline_events, start_run)

spec_path, out = Path(sys.argv[1]), sys.argv[2]
spec = load_pipeline_spec(spec_path)
builder = SparkSession.builder.remote("local[2]")
for k, v in spec.configuration.items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
graph = create_dataflow_graph(spark, default_catalog=spec.catalog,
                              default_database=spec.database, sql_conf=spec.configuration)
register_definitions(spec_path, SparkConnectGraphElementRegistry(spark, graph), spec, spark,
                     graph)
started = time.perf_counter()
handle_pipeline_events(start_run(spark, graph, full_refresh=None, full_refresh_all=False,
                                 refresh=None, dry=False, storage=spec.storage))
seconds = time.perf_counter() - started
tables = {t: [r.asDict(recursive=True) for r in spark.read.table(f"mem.default.{t}").collect()]
          for t in ("current_t", "history_t")}
Path(out).write_text(json.dumps({"seconds": seconds, **tables}, default=str))
spark.stop()
"""


def build_catalog(work: Path) -> Path:
    """Compile ``MemCatalog`` against pyspark's jars; the jar's path."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    src = work / "java" / "memcdc" / "MemCatalog.java"
    src.parent.mkdir(parents=True)
    src.write_text(MEM_CATALOG)
    classes = work / "java" / "classes"
    subprocess.run(
        ["javac", "-nowarn", "-cp", f"{jars}/*", "-d", str(classes), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    jar = work / "memcdc.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(classes), "."], check=True)
    return jar


def run_autocdc(
    batches: list[list[Event]], work: Path, python: str, sequence: str
) -> dict[str, Any]:
    """The pipeline over one text file per micro-batch; both targets read back."""
    jar = build_catalog(work)
    inputs = work / "input"
    inputs.mkdir()
    offset = 0
    for b, evs in enumerate(batches):
        lines = []
        for ev in evs:
            lines.append(f"{offset}\t{'null' if ev is None else json.dumps(ev)}")
            offset += 1
        (inputs / f"batch-{b:05d}.txt").write_text("\n".join(lines) + "\n")
        os.utime(inputs / f"batch-{b:05d}.txt", (b + 1, b + 1))  # files are read by age
    root = work / "pipeline"
    (root / "transformations").mkdir(parents=True)
    (root / "spark-pipeline.yml").write_text(
        f"name: autocdc_bench\nstorage: file://{root}/storage\ncatalog: mem\n"
        "database: default\nconfiguration:\n  spark.sql.catalog.mem: memcdc.MemCatalog\n"
        "  spark.sql.shuffle.partitions: '2'\n"
        "libraries:\n  - glob:\n      include: transformations/**\n"
    )
    seq = {"lsn": '"lsn"', "offset": '"offset"'}[sequence]
    (root / "transformations" / "cdc.py").write_text(
        f"INPUT = {str(inputs)!r}\nSEQUENCE = {seq}\n{FLOWS}"
    )
    (work / "driver.py").write_text(DRIVER)
    out = work / "autocdc.json"
    env = {
        **os.environ,
        "SPARK_DIST_CLASSPATH": str(jar),
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
    }
    done = subprocess.run(
        [python, str(work / "driver.py"), str(root / "spark-pipeline.yml"), str(out)],
        env=env, capture_output=True, text=True, cwd=work,
    )  # fmt: skip
    if done.returncode != 0 or not out.exists():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
        raise SystemExit(f"the pipeline failed (exit {done.returncode}):\n{tail}")
    res = json.loads(out.read_text())
    history = res["history_t"]
    return {
        "seconds": res["seconds"],
        "current": {
            int(r["id"]): {k: r[k] for k in ("id", "name", "qty") if r.get(k) is not None}
            for r in res["current_t"]
        },
        "versions": len(history),
        "open": sum(1 for r in history if r["__END_AT"] in (None, "None")),
        "history": history,
        "columns": {t: sorted(res[t][0]) if res[t] else [] for t in ("current_t", "history_t")},
    }


def compare(name: str, got: dict[int, Any], truth: dict[int, Any]) -> str:
    """``exact`` or the differences by row key."""
    clean = {k: {f: v for f, v in r.items() if v is not None} for k, r in got.items()}
    want = {k: {f: v for f, v in r.items() if v is not None} for k, r in truth.items()}
    missing = sorted(set(want) - set(clean))
    extra = sorted(set(clean) - set(want))
    different = sorted(k for k in set(want) & set(clean) if want[k] != clean[k])
    if not (missing or extra or different):
        return f"{name}: exact ({len(want)} rows)"
    return (
        f"{name}: {len(missing)} missing {missing[:5]}, {len(extra)} extra "
        f"{[clean[k] for k in extra[:5]]}, {len(different)} different "
        f"{[(want[k], clean[k]) for k in different[:3]]}"
    )


def main() -> int:
    """Run both on one input; print the tables' comparison and the times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["worked", "random"], default="worked")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--sequence", choices=["lsn", "offset"], default="lsn")
    parser.add_argument("--sdp-python", default=sys.executable)
    parser.add_argument("--show-history", action="store_true")
    args = parser.parse_args()
    if args.scenario == "worked":
        batches, truth = worked()
    else:
        batches, truth = generated(args.events, args.rows, args.batches)
    n = sum(len(b) for b in batches)
    print(f"{n} Debezium records in {len(batches)} micro-batches, {len(truth)} rows at the end")
    with tempfile.TemporaryDirectory(prefix="autocdc-") as tmp:
        work = Path(tmp)
        (work / "inorder").mkdir()
        ino = run_inorder(batches, work / "inorder")
        acdc = run_autocdc(batches, work / "autocdc", args.sdp_python, args.sequence)
    print(compare("inorder current table", ino["current"], truth))
    print(compare(f"AutoCDC SCD1 table (sequence_by {args.sequence})", acdc["current"], truth))
    print(
        f"history: inorder {ino['versions']} versions ({ino['open']} open, "
        f"{ino['duplicates']} redelivered events skipped); AutoCDC SCD2 {acdc['versions']} "
        f"versions ({acdc['open']} open)"
    )
    print(
        f"AutoCDC columns: SCD1 {acdc['columns']['current_t']}, SCD2 {acdc['columns']['history_t']}"
    )
    if args.show_history:
        for r in sorted(acdc["history"], key=lambda r: (r["id"], int(r["__START_AT"]))):
            print(f"  AutoCDC id {r['id']} {r.get('name')} [{r['__START_AT']}, {r['__END_AT']})")
    print(
        f"time: inorder {ino['seconds']:.2f} s (apply, change log, Delta tables; no Spark); "
        f"AutoCDC {acdc['seconds']:.2f} s (pipeline run, two flows, in-memory targets; "
        f"Spark start not included); load {os.getloadavg()[0]:.2f}"
    )
    return 0


MEM_CATALOG = r"""package memcdc;

import java.util.*;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.*;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.*;
import org.apache.spark.sql.connector.write.*;
import org.apache.spark.sql.types.*;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A table catalog held in the JVM's memory whose tables support MERGE (copy-on-write, whole
 * table as one group). For a local test of Spark Declarative Pipelines' AutoCDC flows only. */
public class MemCatalog implements TableCatalog, SupportsNamespaces {
  static final Map<String, MemTable> TABLES = new ConcurrentHashMap<>();
  static final Map<String, List<InternalRow>> STAGED = new ConcurrentHashMap<>();
  private String name;

  static String key(Identifier id) { return String.join(".", id.namespace()) + "." + id.name(); }

  @Override public void initialize(String name, CaseInsensitiveStringMap options) { this.name = name; }
  @Override public String name() { return name; }

  @Override public Identifier[] listTables(String[] ns) {
    String prefix = String.join(".", ns) + ".";
    List<Identifier> out = new ArrayList<>();
    for (String k : TABLES.keySet())
      if (k.startsWith(prefix) && !k.substring(prefix.length()).contains("."))
        out.add(Identifier.of(ns, k.substring(prefix.length())));
    return out.toArray(new Identifier[0]);
  }

  @Override public Table loadTable(Identifier id) throws org.apache.spark.sql.catalyst.analysis.NoSuchTableException {
    MemTable t = TABLES.get(key(id));
    if (t == null) throw new org.apache.spark.sql.catalyst.analysis.NoSuchTableException(id);
    return t;
  }

  @Override public Table createTable(Identifier id, StructType schema, Transform[] parts, Map<String, String> props) {
    MemTable t = new MemTable(key(id), schema, parts, props);
    TABLES.put(key(id), t);
    return t;
  }

  @Override public Table createTable(Identifier id, Column[] cols, Transform[] parts, Map<String, String> props) {
    StructType s = new StructType();
    for (Column c : cols) s = s.add(new StructField(c.name(), c.dataType(), c.nullable(), Metadata.empty()));
    return createTable(id, s, parts, props);
  }

  @Override public Table createTable(Identifier id, TableInfo info) {
    return createTable(id, info.columns(), info.partitions(), info.properties());
  }

  @Override public Table alterTable(Identifier id, TableChange... changes) throws org.apache.spark.sql.catalyst.analysis.NoSuchTableException {
    MemTable t = (MemTable) loadTable(id);
    synchronized (t) {
      for (TableChange c : changes) {
        if (c instanceof TableChange.SetProperty sp) t.props.put(sp.property(), sp.value());
        else if (c instanceof TableChange.RemoveProperty rp) t.props.remove(rp.property());
        else if (c instanceof TableChange.AddColumn ac && ac.fieldNames().length == 1) {
          t.schema = t.schema.add(new StructField(ac.fieldNames()[0], ac.dataType(), ac.isNullable(), Metadata.empty()));
          int n = t.schema.size();
          List<InternalRow> widened = new ArrayList<>();
          for (InternalRow r : t.rows) {
            Object[] v = new Object[n];
            for (int i = 0; i < n - 1; i++) v[i] = r.isNullAt(i) ? null : r.get(i, t.schema.fields()[i].dataType());
            widened.add(new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(v));
          }
          t.rows = widened;
        }
      }
    }
    return t;
  }

  @Override public boolean dropTable(Identifier id) { return TABLES.remove(key(id)) != null; }
  @Override public void renameTable(Identifier a, Identifier b) { MemTable t = TABLES.remove(key(a)); if (t != null) TABLES.put(key(b), t); }

  @Override public String[][] listNamespaces() { return new String[][] {{"default"}}; }
  @Override public String[][] listNamespaces(String[] ns) { return new String[0][]; }
  @Override public boolean namespaceExists(String[] ns) { return true; }
  @Override public Map<String, String> loadNamespaceMetadata(String[] ns) { return new HashMap<>(); }
  @Override public void createNamespace(String[] ns, Map<String, String> md) {}
  @Override public void alterNamespace(String[] ns, NamespaceChange... c) {}
  @Override public boolean dropNamespace(String[] ns, boolean cascade) { return true; }

  /** One table: a list of rows replaced or appended to at each commit. */
  public static class MemTable implements SupportsRead, SupportsWrite, SupportsRowLevelOperations {
    final String name; volatile StructType schema; final Transform[] parts; final Map<String, String> props;
    volatile List<InternalRow> rows = new ArrayList<>();
    MemTable(String name, StructType schema, Transform[] parts, Map<String, String> props) {
      this.name = name; this.schema = schema; this.parts = parts; this.props = new HashMap<>(props);
    }
    @Override public String name() { return name; }
    @Override public StructType schema() { return schema; }
    @Override public Transform[] partitioning() { return parts; }
    @Override public Map<String, String> properties() { return props; }
    @Override public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ, TableCapability.BATCH_WRITE, TableCapability.TRUNCATE);
    }
    @Override public ScanBuilder newScanBuilder(CaseInsensitiveStringMap o) { return new MemScan(this); }
    @Override public WriteBuilder newWriteBuilder(LogicalWriteInfo info) { return new MemWriteBuilder(this, false); }
    @Override public RowLevelOperationBuilder newRowLevelOperationBuilder(RowLevelOperationInfo info) {
      MemTable t = this;
      return () -> new RowLevelOperation() {
        @Override public Command command() { return info.command(); }
        @Override public ScanBuilder newScanBuilder(CaseInsensitiveStringMap o) { return new MemScan(t); }
        @Override public WriteBuilder newWriteBuilder(LogicalWriteInfo w) { return new MemWriteBuilder(t, true); }
      };
    }
  }

  static class MemScan implements ScanBuilder, Scan, Batch {
    final MemTable t; final StructType schema; final String snap = UUID.randomUUID().toString();
    MemScan(MemTable t) { this.t = t; this.schema = t.schema; }
    @Override public Scan build() { return this; }
    @Override public StructType readSchema() { return schema; }
    @Override public Batch toBatch() { return this; }
    @Override public InputPartition[] planInputPartitions() {
      STAGED.put("read-" + snap, new ArrayList<>(t.rows));
      return new InputPartition[] {new Part(snap)};
    }
    @Override public PartitionReaderFactory createReaderFactory() { return new ReaderFactory(); }
  }

  record Part(String snap) implements InputPartition {}

  static class ReaderFactory implements PartitionReaderFactory {
    @Override public PartitionReader<InternalRow> createReader(InputPartition p) {
      List<InternalRow> rows = STAGED.get("read-" + ((Part) p).snap());
      Iterator<InternalRow> it = rows.iterator();
      return new PartitionReader<>() {
        InternalRow cur;
        public boolean next() { if (!it.hasNext()) return false; cur = it.next(); return true; }
        public InternalRow get() { return cur; }
        public void close() {}
      };
    }
  }

  static class MemWriteBuilder implements WriteBuilder, SupportsTruncate, Write, BatchWrite {
    final MemTable t; boolean replace; final String id = UUID.randomUUID().toString();
    MemWriteBuilder(MemTable t, boolean replace) { this.t = t; this.replace = replace; }
    @Override public WriteBuilder truncate() { replace = true; return this; }
    @Override public Write build() { return this; }
    @Override public BatchWrite toBatch() { return this; }
    @Override public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
      STAGED.put("write-" + id, Collections.synchronizedList(new ArrayList<>()));
      return new WriterFactory(id);
    }
    @Override public void commit(WriterCommitMessage[] messages) {
      List<InternalRow> staged = STAGED.remove("write-" + id);
      synchronized (t) {
        List<InternalRow> next = replace ? new ArrayList<>() : new ArrayList<>(t.rows);
        next.addAll(staged);
        t.rows = next;
      }
    }
    @Override public void abort(WriterCommitMessage[] messages) { STAGED.remove("write-" + id); }
  }

  static final class Msg implements WriterCommitMessage {}

  record WriterFactory(String id) implements DataWriterFactory {
    @Override public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
      List<InternalRow> mine = new ArrayList<>();
      return new DataWriter<>() {
        public void write(InternalRow r) { mine.add(r.copy()); }
        public WriterCommitMessage commit() { STAGED.get("write-" + id).addAll(mine); return new Msg(); }
        public void abort() {}
        public void close() {}
      };
    }
  }
}
"""

if __name__ == "__main__":
    sys.exit(main())
