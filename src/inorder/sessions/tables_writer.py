"""Keeping the current and history session tables, exactly once per micro-batch.

After micro-batch ``B``'s change rows are committed, :meth:`SessionTablesWriter.after_commit`
reads them back from the change log, plans the batch's net change per row key
(:func:`~inorder.sessions.tables_plan.plan_batch`, pure) and applies it to each table with
one MERGE committed as ``txn(app_id, B)`` (:mod:`inorder.sessions.tables_delta`), or for
Iceberg tables one catalog commit whose snapshot summaries name ``B``
(:mod:`inorder.sessions.tables_iceberg`).

Each table knows the last batch it holds (its transaction version). A table behind the change
log (a crash between the change log's commit and the table's, a table added to a running
pipeline, a repair that restored it) catches up: the change rows of the batches after its
own up to ``B``, :data:`CATCH_UP_BATCHES` batches per commit (each commit records the last
batch it holds). A table at or past ``B`` is left alone, so the re-run of a
batch commits nothing twice. The row ids each session has, which the planner needs, are kept
in memory between batches and read back from the table itself after a start or a failure.

Batch ids are the change log's (its ``batch_id`` column), as for the materializer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from inorder.errors import ConfigError
from inorder.sessions.processor import SessionTables
from inorder.sessions.rebuild import ordered_changes
from inorder.sessions.tables_delta import (
    DeltaTableOutput,
    TableKind,
    TablesError,
    current_schema,
    history_schema,
)
from inorder.sessions.tables_iceberg import IcebergTableOutput
from inorder.sessions.tables_plan import END_MODES, BatchPlan, EndMode, plan_batch
from inorder.sinks.base import Sink, SinkError

#: Change-log batches a table behind the change log applies per commit while catching up.
CATCH_UP_BATCHES = 8
#: Where the tables are kept.
FORMATS = ("delta", "iceberg")
TableOutput = DeltaTableOutput | IcebergTableOutput


@dataclass(frozen=True)
class TableOutputs:
    """Where a session-table pipeline keeps its query-ready tables (docs/tables.md).

    ``current``: path of the current table (one row per live row), ``history``: path of the
    history table (one row per version); either may be ``None``. ``end``: whether a session's
    ``end`` keeps its rows in the tables (``"keep"``, its final table, like the change log)
    or removes them (``"drop"``). ``storage_options`` as for the sinks (S3 endpoint...).

    ``format``: ``"delta"`` (default) or ``"iceberg"``. Iceberg tables are named
    ``"namespace.name"`` in ``current`` / ``history``; ``warehouse``, ``catalog`` and
    ``catalog_file`` say where, as for the Iceberg sink (the SQL catalog on
    ``<warehouse>/catalog.db`` by default).
    """

    current: str | None = None
    history: str | None = None
    end: EndMode = "keep"
    storage_options: Mapping[str, str] | None = None
    format: str = "delta"
    warehouse: str | None = None
    catalog: Mapping[str, str] | None = None
    catalog_file: str | None = None

    def __post_init__(self) -> None:
        if self.current is None and self.history is None:
            raise ConfigError("tables: give a current or a history table path (or both)")
        if self.end not in END_MODES:
            raise ConfigError(f"tables.end: must be 'keep' or 'drop', not {self.end!r}")
        if self.format not in FORMATS:
            raise ConfigError(f"tables.format: must be 'delta' or 'iceberg', not {self.format!r}")
        if self.current is not None and self.current == self.history:
            raise ConfigError("tables: current and history need different paths")
        if self.format == "iceberg":
            for name in (self.current, self.history):
                if name is not None and (name.count(".") < 1 or not all(name.split("."))):
                    raise ConfigError(
                        f"tables: Iceberg table {name!r} must be named 'namespace.name'"
                    )
            self.catalog_properties()  # a catalog that cannot be described fails here
        elif self.catalog or self.warehouse or self.catalog_file:
            raise ConfigError("tables: warehouse, catalog and catalog_file need format = 'iceberg'")

    def catalog_properties(self) -> dict[str, str]:
        """The pyiceberg catalog properties of Iceberg tables."""
        from inorder.sinks.iceberg_catalog import catalog_properties

        warehouse = self.warehouse or (self.catalog or {}).get("warehouse", "")
        if not warehouse:
            raise ConfigError("tables: Iceberg tables need a warehouse (or catalog.warehouse)")
        try:
            return catalog_properties(
                self.catalog, warehouse, self.catalog_file, self.storage_options
            )
        except SinkError as exc:
            raise ConfigError(f"tables: {exc}") from None


@dataclass
class TablesReport:
    """What one batch did to the tables."""

    batch_id: int
    committed: list[str] = field(default_factory=list)
    """The tables that got a commit (``current``, ``history``)."""
    caught_up: int = 0
    """Batches before ``batch_id`` applied as well (a table was behind)."""
    seconds: float = 0.0


@dataclass
class _Kept:
    """One table and what is known of it between batches."""

    table: TableOutput
    live: pa.Table | None = None
    """Keys of the table's live rows (``tables_plan.LIVE_SCHEMA``); ``None``: not known."""
    through: int = -1


class SessionTablesWriter:
    """Keeps ``outputs``' tables in step with the change log in ``changes``. Driver side."""

    def __init__(
        self,
        processor: SessionTables,
        changes: Sink,
        outputs: TableOutputs,
        catch_up_batches: int = CATCH_UP_BATCHES,
    ) -> None:
        from inorder.schema import output_schema
        from inorder.sessions.materializer import change_log_of, row_fields

        self.changes, self.batch_offset = change_log_of(changes)
        self.end: EndMode = outputs.end
        if catch_up_batches < 1:
            raise ConfigError(f"tables: catch_up_batches must be 1 or more, not {catch_up_batches}")
        self.catch_up_batches = catch_up_batches
        owner = changes.owner
        app_id = f"inorder-{owner}" if owner else "inorder"
        log_schema = output_schema(processor.out_type)
        self._row_names = [f.name for f in row_fields(processor)]
        self._kept: list[_Kept] = []
        self.format = outputs.format
        options = outputs.storage_options
        props = outputs.catalog_properties() if outputs.format == "iceberg" else {}
        wanted: tuple[tuple[TableKind, str | None, Callable[..., pa.Schema]], ...] = (
            ("current", outputs.current, current_schema),
            ("history", outputs.history, history_schema),
        )
        for kind, where, schema_of in wanted:
            if where is None:
                continue
            schema = schema_of(log_schema, self._row_names)
            table: TableOutput
            if outputs.format == "iceberg":
                table = IcebergTableOutput(kind, where, schema, props, app_id)
            else:
                table = DeltaTableOutput(kind, where, schema, options, app_id)
            self._kept.append(_Kept(table))

    @property
    def outputs(self) -> list[TableOutput]:
        """The tables kept, current first, in either format."""
        return [k.table for k in self._kept]

    def forget(self) -> None:
        """Read each table's batch and row keys back from the table before the next batch
        (after something else changed the tables: a restore)."""
        for kept in self._kept:
            kept.live = None

    def check(self) -> None:
        """Before the first batch: create the tables or check the existing ones."""
        for kept in self._kept:
            try:
                kept.table.check()
                if kept.table.written() and kept.table.committed_batch() is None:
                    raise TablesError(
                        f"{kept.table.describe()}: holds data this pipeline's checkpoint did "
                        "not commit; use a new path or the checkpoint that wrote it"
                    )
            except TablesError as exc:
                raise ConfigError(str(exc)) from None

    def after_commit(self, batch_id: int) -> TablesReport:
        """Bring every table to checkpoint batch ``batch_id``, whose change rows are committed."""
        started = time.perf_counter()
        b = self.batch_offset + batch_id
        report = TablesReport(batch_id=b)
        try:
            # A table far behind catches up a bounded number of batches per commit, so the
            # change rows held in memory stay bounded too.
            while work := self._plan(b):
                for kept, first, last, changes, plan in work:
                    merged = kept.table.merge(plan, changes, first, last)
                    if merged and kept.table.kind not in report.committed:
                        report.committed.append(kept.table.kind)
                    report.caught_up = max(report.caught_up, b - first)
                for kept, _, last, _, plan in work:
                    kept.live = plan.live
                    kept.through = last
        except BaseException:
            for kept in self._kept:
                kept.live = None  # half-known: read back from the table next time
            raise
        report.seconds = time.perf_counter() - started
        return report

    def _plan(self, b: int) -> list[tuple[_Kept, int, int, pa.Table, BatchPlan]]:
        """Each table behind ``b``: its next batches (at most ``catch_up_batches``), their
        change rows and the plan."""
        work: list[tuple[_Kept, int, int, pa.Table, BatchPlan]] = []
        read: dict[tuple[int, int], pa.Table] = {}
        for kept in self._kept:
            if kept.live is None:
                committed = kept.table.committed_batch()
                kept.live = kept.table.live_keys()
                kept.through = -1 if committed is None else committed
            if kept.through >= b:
                continue  # this batch (or a later one) is in the table: a re-run
            first = kept.through + 1
            last = min(b, first + self.catch_up_batches - 1)
            changes = read.get((first, last))
            if changes is None:
                changes = read[(first, last)] = self._read(first, last)
            # Tables at the same batch hold the same row keys: one plan serves both.
            same = [w for w in work if w[1:3] == (first, last) and _same_keys(w[0].live, kept.live)]
            plan = same[0][4] if same else plan_batch(kept.live, changes, self.end)
            work.append((kept, first, last, changes, plan))
        return work

    def _read(self, first: int, last: int) -> pa.Table:
        """Change rows of batches ``first..last`` in application order."""
        wanted = [
            "topic",
            "partition",
            "offset",
            "kafka_ts",
            "session",
            "op",
            "row_id",
            *self._row_names,
            "batch_id",
        ]
        table = self.changes.read_batches(first, last, columns=wanted)
        return ordered_changes(table).combine_chunks()


def _same_keys(a: pa.Table | None, b: pa.Table | None) -> bool:
    """Whether two live-key tables are the same object or hold the same keys."""
    if a is b:
        return True
    if a is None or b is None or a.num_rows != b.num_rows:
        return False
    order = [(c, "ascending") for c in a.column_names]
    return bool(a.sort_by(order).equals(b.sort_by(order)))


def check_tables(processor: Any, tables: TableOutputs | None) -> None:
    """Raise :class:`ConfigError` unless ``tables`` fit the processor."""
    if tables is None:
        return
    if not isinstance(tables, TableOutputs):
        raise ConfigError(f"tables: expected a TableOutputs, not {type(tables).__name__}")
    if not isinstance(processor, SessionTables):
        raise ConfigError(
            "tables: only session-table pipelines (processor 'sessions') keep current and "
            f"history tables; the processor is {type(processor).__name__}"
        )


def pipeline_tables(pipeline: Any) -> SessionTablesWriter | None:
    """The checked table writer of a pipeline (its sink must be bound), or ``None``."""
    tables: TableOutputs | None = getattr(pipeline, "tables", None)
    check_tables(pipeline.processor, tables)
    if tables is None:
        return None
    if getattr(pipeline, "initial_state", None) is not None:
        # Seeded sessions are in the state but not in the change log the tables follow.
        raise ConfigError("tables: not available with initial_state")
    from inorder.sessions.materializer import change_log_of

    changes, _ = change_log_of(pipeline.sink)
    if tables.format == "iceberg":
        log_path = str(getattr(changes, "table", ""))
    else:
        log_path = str(getattr(changes, "path", "")).rstrip("/")
    for path in (tables.current, tables.history):
        if path is not None and path.rstrip("/") == log_path:
            raise ConfigError(f"tables: {path} is the change log itself; give it its own path")
    writer = SessionTablesWriter(pipeline.processor, pipeline.sink, tables)
    writer.check()
    return writer
