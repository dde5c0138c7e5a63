"""``inorder compact`` on Iceberg session tables, between real pipeline runs.

A pipeline (simulated sessions, local Kafka-protocol broker, Spark) writes both session
tables to Iceberg over several batches. ``inorder compact --format iceberg`` then merges each
table's small files in one snapshot that carries ``inorder.operation = "compact"`` and no
batch id: the rows stay the same, the tables still hold the same batch and ``inorder
validate``'s check stays clean. A second run on new topics continues from that batch (none
applied twice, none skipped), and a rollback through the compaction snapshot still works.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table.snapshots import ancestors_of
from tests.fixtures.sessions_job import (
    duplicate_change_rows,
    sessions_config,
    two_partition_simulation,
)
from tests.integration.test_session_tables import non_empty
from tests.integration.test_session_tables_iceberg import check_history, current_rows

from inorder.assemble import build_pipeline
from inorder.checkpoint.layout import CheckpointLayout
from inorder.cli import build_parser
from inorder.dev.simulator import simulate
from inorder.sessions import rebuild_tables
from inorder.sessions.rebuild import read_changes
from inorder.sessions.tables_check import check_pipeline_tables
from inorder.sessions.tables_delta import BATCH_KEY
from inorder.sessions.tables_iceberg import IcebergTableOutput
from inorder.sessions.tables_ops import ops_writer, restore_tables
from inorder.sessions.tables_writer import SessionTablesWriter
from inorder.sinks.iceberg_history import COMPACT, OPERATION_KEY

NAMES = {"current": "sessions.current", "history": "sessions.history"}


def simulate_sites(prefix: str, seed: int, bootstrap: str) -> None:
    sim = two_partition_simulation(
        prefix,
        seed=seed,
        sites=2,
        sessions_per_site=24,
        rows_per_snapshot=3,
        messages=700,
        restart_every=60,
        end_probability=0.01,
        faulty=0.0,
    )
    simulate(sim, bootstrap)


def writer_of(cfg: dict[str, Any]) -> SessionTablesWriter:
    """The tables' writer of the pipeline, bound to its checkpoint as the runs were."""
    pipeline = build_pipeline(cfg)
    info = CheckpointLayout.of(cfg["pipeline"]["checkpoint"]).read_info()
    assert info is not None
    pipeline.sink.bind(str(info["id"]))
    writer = ops_writer(pipeline)
    assert writer is not None
    return writer


def tables_of(writer: SessionTablesWriter) -> dict[str, IcebergTableOutput]:
    out: dict[str, IcebergTableOutput] = {}
    for t in writer.outputs:
        assert isinstance(t, IcebergTableOutput)
        out[t.kind] = t
    return out


def sorted_rows(table: IcebergTableOutput) -> pa.Table:
    rows: pa.Table = table.open().scan().to_arrow()
    return rows.sort_by([(c, "ascending") for c in rows.column_names])


def data_files(table: IcebergTableOutput) -> int:
    return len(list(table.open().scan().plan_files()))


def compact_cli(warehouse: Path, name: str) -> dict[str, Any]:
    """``inorder compact WAREHOUSE --format iceberg --table NAME --full --json`` in this
    process (``--full``: every non-final file, however young)."""
    args = build_parser().parse_args(
        ["compact", str(warehouse), "--format", "iceberg", "--table", name, "--full", "--json"]
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert int(args.func(args)) == 0
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def check_clean(cfg: dict[str, Any], last: int) -> None:
    """`inorder validate`'s tables check: both tables hold batches 0..last, no discrepancy."""
    info = CheckpointLayout.of(cfg["pipeline"]["checkpoint"]).read_info()
    assert info is not None
    check = check_pipeline_tables(build_pipeline(cfg), str(info["id"]))
    assert check is not None
    assert check.ok, "\n".join(check.lines())
    for t in check.tables:
        assert (t.first_batch, t.last_batch, t.pending) == (0, last, None), check.lines()


def check_against_change_log(cfg: dict[str, Any], writer: SessionTablesWriter) -> int:
    """Both tables are the change log rebuilt; the change log's last batch."""
    changes = read_changes(cfg["sink"]["path"])
    assert duplicate_change_rows(changes) == 0
    tables = tables_of(writer)
    current = tables["current"].open().scan().to_arrow()
    assert current_rows(current) == non_empty(rebuild_tables(changes))
    history = tables["history"].open().scan().to_arrow()
    # No version twice: no batch was applied again.
    versions = pl.from_arrow(history.select(["topic", "session", "row_id", "valid_from_offset"]))
    assert isinstance(versions, pl.DataFrame) and versions.is_unique().all()
    assert check_history(changes, history, 30) == 30
    return int(pc.max(changes.column("batch_id")).as_py())


def test_compacted_iceberg_session_tables_keep_their_rows_and_batches(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    prefix = f"icompact-{random.randrange(10**9)}-"
    simulate_sites(f"{prefix}a", 41, kafka.bootstrap_servers)
    warehouse = tmp_path / "warehouse"
    tables = {"format": "iceberg", **NAMES, "warehouse": str(warehouse)}
    cfg = sessions_config(kafka.bootstrap_servers, prefix, tmp_path, max_offsets=120, tables=tables)
    assert build_pipeline(cfg).run().stopped_because == "caught up"

    writer = writer_of(cfg)
    held = check_against_change_log(cfg, writer)
    assert held >= 4, "the run should take several batches"
    check_clean(cfg, held)

    # Compaction: fewer files, the same rows, one snapshot saying so and naming no batch.
    for kind, table in tables_of(writer).items():
        assert table.committed_batch() == held
        # The pipeline's tables have no name mapping; the merged files carry no field ids,
        # so the compaction gives the table one in its commit, or nothing could read them.
        assert table.open().metadata.name_mapping() is None
        rows, files = sorted_rows(table), data_files(table)
        report = compact_cli(warehouse, NAMES[kind])
        assert report["files_before"] == files and report["files_replaced"] > 1, (kind, report)
        assert data_files(table) == files - report["files_replaced"] + report["files_written"]
        assert data_files(table) < files, kind
        assert sorted_rows(table).equals(rows), kind
        snap = table.open().current_snapshot()
        assert snap is not None and snap.snapshot_id == report["snapshot_id"]
        assert snap.summary is not None
        summary = snap.summary.additional_properties
        assert summary[OPERATION_KEY] == COMPACT and BATCH_KEY not in summary, summary
        # The batch the table holds is still found behind the compaction snapshot.
        assert table.committed_batch() == held
        assert tables_of(writer_of(cfg))[kind].committed_batch() == held
    check_clean(cfg, held)

    # A later run (new topics) continues from the batch the tables hold.
    simulate_sites(f"{prefix}b", 42, kafka.bootstrap_servers)
    assert build_pipeline(cfg).run().stopped_because == "caught up"
    writer = writer_of(cfg)
    last = check_against_change_log(cfg, writer)
    assert last > held
    check_clean(cfg, last)
    for table in tables_of(writer).values():
        ice = table.open()
        lineage = ancestors_of(ice.current_snapshot(), ice.metadata)
        # The compaction snapshot is on the lineage the batch was looked up through.
        assert any(s.summary and s.summary.get(OPERATION_KEY) == COMPACT for s in lineage)
        assert table.committed_batch() == last

    # A repair's rollback to before batch held+1 goes back behind the compaction snapshot
    # (to the commit of batch `held` or earlier); the writer then catches up again.
    kept = restore_tables(writer, held + 1)
    assert all(k <= held for k in kept), kept
    for table, k in zip(tables_of(writer).values(), kept, strict=True):
        assert table.committed_batch() == k
    assert writer_of(cfg).after_commit(last).caught_up > 0
    assert check_against_change_log(cfg, writer) == last
    check_clean(cfg, last)
