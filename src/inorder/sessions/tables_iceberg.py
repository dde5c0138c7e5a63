"""The current (SCD1) and history (SCD2) session tables as Iceberg tables (pyiceberg).

An :class:`IcebergTableOutput` is one of the two tables, with the interface of
:class:`~inorder.sessions.tables_delta.DeltaTableOutput`. A batch's change is one pyiceberg
transaction committed to the catalog once (:meth:`IcebergTableOutput.merge`): a copy-on-write
overwrite of the rows of the sessions the batch touches, rewritten as the batch leaves them.
Both snapshots it makes (the delete and the append) become visible in the same catalog
commit, and their summaries carry ``inorder.app-id`` (the pipeline checkpoint),
``inorder.batch``, ``inorder.first_batch`` and ``inorder.offsets``. The last batch a table
holds is the newest such summary of the pipeline's app id among the current snapshot's
ancestors (:meth:`IcebergTableOutput.committed_batch`), so a rollback of the table moves it
back too.

Tables are partitioned as the Delta ones: by ``topic`` (the history by ``is_current`` as
well), so closing versions reads the open versions of the batch's topics only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.errors import ConfigError, InorderError
from inorder.sessions.tables_delta import (
    ACTION_COLUMN,
    BATCH_KEY,
    FIRST_BATCH_KEY,
    KEY_COLUMNS,
    OFFSETS_KEY,
    TableKind,
    TablesError,
    current_source,
    history_source,
    offset_ranges,
)
from inorder.sessions.tables_plan import BatchPlan, live_table
from inorder.sinks.delta import delta_schema
from inorder.sinks.iceberg_catalog import (
    create_table,
    describe_catalog,
    open_catalog,
    parse_partition_by,
    require_pyiceberg,
    secrets_of,
)
from inorder.sinks.iceberg_history import APP_ID_KEY
from inorder.storage import fs as sfs

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

#: The history columns a close sets on an open version.
_CLOSING = ("valid_to_offset", "valid_to_ts", "is_current", "closed_by", "closed_batch_id")
_SEP = "\x1f"  # joins a row key's parts: not expected inside topic or session names


class IcebergTableOutput:
    """One session table (``kind``) stored as the Iceberg table ``identifier``.

    ``catalog`` holds the pyiceberg catalog properties
    (:func:`~inorder.sinks.iceberg_catalog.catalog_properties`).
    """

    def __init__(
        self,
        kind: TableKind,
        identifier: str,
        schema: pa.Schema,
        catalog: Mapping[str, str],
        app_id: str = "inorder",
    ) -> None:
        if identifier.count(".") < 1 or not all(identifier.split(".")):
            raise TablesError(f"{kind} table {identifier!r}: must be 'namespace.name'")
        require_pyiceberg("Iceberg session tables")  # before anything imports it
        self.kind: TableKind = kind
        self.partition_by = ["topic"] if kind == "current" else ["topic", "is_current"]
        self.path = identifier
        self.schema = schema
        self.app_id = app_id
        self._props = dict(catalog)
        self._catalog: Catalog | None = None

    def describe(self) -> str:
        """One line for humans (no credentials)."""
        return f"{self.kind} table {self.path} (Iceberg, {describe_catalog(self._props)})"

    def failure(self, what: str, exc: BaseException) -> TablesError:
        """A one-line error about this table (credentials never shown)."""
        detail = sfs.describe_error(exc, secrets_of(self._props))
        return TablesError(f"{self.describe()}: {what}: {detail}")

    def catalog(self) -> Catalog:
        """The catalog client (opened once)."""
        if self._catalog is None:
            try:
                self._catalog = open_catalog(self._props)
            except ConfigError:
                raise  # a setting or an install to fix (exit 2), named as it is
            except InorderError as exc:
                raise TablesError(f"{self.describe()}: {exc}") from None
        return self._catalog

    def load(self) -> Table | None:
        """The table as the catalog has it now (``None`` when it does not exist)."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        catalog = self.catalog()
        try:
            return catalog.load_table(self.path)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except Exception as exc:
            raise self.failure("cannot load", exc) from None

    def open(self) -> Table:
        """The table as the catalog has it now (pyiceberg ``Table``)."""
        table = self.load()
        if table is None:
            raise TablesError(f"{self.describe()}: does not exist")
        return table

    def exists(self) -> bool:
        """Whether the table exists (nothing is created)."""
        return self.load() is not None

    def written(self) -> bool:
        """Whether anything was ever committed to the table."""
        return self.open().current_snapshot() is not None

    def check(self) -> None:
        """Create the table if absent; an existing one must have this schema and layout."""
        try:
            table = self.load()
            if table is None:
                create_table(
                    self.catalog(),
                    self.path,
                    self.schema,
                    parse_partition_by(self.partition_by),
                    {},
                )
                return
            have = [(f.name, str(f.type)) for f in delta_schema(table.schema().as_arrow())]
            layout = [
                table.schema().find_column_name(f.source_id)
                for f in table.spec().fields
                if str(f.transform).lower() == "identity"
            ]
            transforms = len(table.spec().fields)
        except TablesError:
            raise
        except Exception as exc:
            raise self.failure("cannot open or create", exc) from None
        want = [(f.name, str(f.type)) for f in delta_schema(self.schema)]
        if have != want:
            gone = [n for n, _ in have if n not in dict(want)]
            new = [n for n, _ in want if n not in dict(have)]
            raise TablesError(
                f"{self.describe()}: its columns differ from this pipeline's session rows "
                f"(table only: {gone or 'none'}; pipeline only: {new or 'none'}; or types "
                "differ); give the table a new name"
            )
        if layout != self.partition_by or transforms != len(layout):
            raise TablesError(
                f"{self.describe()}: partitioned by {layout}, not {self.partition_by}; "
                "give the table a new name"
            )

    def commits(
        self, table: Table | None = None, any_app: bool = False
    ) -> Iterator[tuple[Snapshot, dict[str, str]]]:
        """This pipeline's batch commits (``any_app``: any pipeline's) on the current
        snapshot's lineage, newest first.

        A batch commit is two snapshots when it replaced rows (a delete, then an append):
        only the newest of one commit is given.
        """
        from pyiceberg.table.snapshots import ancestors_of

        table = table if table is not None else self.open()
        seen: str | None = None
        for snap in ancestors_of(table.current_snapshot(), table.metadata):
            props = dict(snap.summary.additional_properties) if snap.summary else {}
            if BATCH_KEY not in props or (not any_app and props.get(APP_ID_KEY) != self.app_id):
                continue
            commit = props.get(_COMMIT_KEY)
            if commit is not None and commit == seen:
                continue
            seen = commit
            yield snap, props

    def committed_batch(self) -> int | None:
        """The last micro-batch this pipeline's ``app_id`` committed to the table."""
        try:
            for _, props in self.commits():
                return int(props[BATCH_KEY])
        except TablesError:
            raise
        except Exception as exc:
            raise self.failure("cannot read its snapshots", exc) from None
        return None

    def live_keys(self) -> pa.Table:
        """Keys of the live rows (the current table's rows, the history's open versions)."""
        from pyiceberg.expressions import AlwaysTrue

        try:
            table = self.open()
            wanted = _is_current() if self.kind == "history" else AlwaysTrue()
            keys = table.scan(row_filter=wanted, selected_fields=KEY_COLUMNS).to_arrow()
        except TablesError:
            raise
        except Exception as exc:
            raise self.failure("cannot read its rows", exc) from None
        return live_table(keys)

    # -- one commit ------------------------------------------------------------------------

    def merge(self, plan: BatchPlan, changes: pa.Table, first: int, last: int) -> dict[str, Any]:
        """Apply ``plan`` (of ``changes``, batches ``first..last``) as the commit of ``last``.

        One catalog commit: the rows of the sessions the batch touches are deleted and
        appended again as the batch leaves them (with its new rows). Returns row counts
        (empty when the plan changes nothing in this table).
        """
        from pyiceberg.exceptions import CommitFailedException

        if self.kind == "current":
            source = current_source(plan, changes, self.schema)
        else:
            source = history_source(plan, changes, self.schema, last)
        if source.num_rows == 0:
            return {}
        summary = {
            APP_ID_KEY: self.app_id,
            BATCH_KEY: str(last),
            FIRST_BATCH_KEY: str(first),
            OFFSETS_KEY: offset_ranges(changes),
            _COMMIT_KEY: uuid.uuid4().hex,
        }
        try:
            table = self._for_commit()
            replaced: BooleanExpression | None
            if self.kind == "current":
                replaced, rows = self._current_rows(table, source)
            else:
                replaced, rows = self._history_rows(table, source)
            txn = table.transaction()
            if replaced is None:
                txn.append(rows, snapshot_properties=summary)
            else:
                # Delete and append are staged in one transaction: one catalog commit.
                txn.overwrite(rows, overwrite_filter=replaced, snapshot_properties=summary)
            txn.commit_transaction()
        except TablesError:
            raise
        except CommitFailedException as exc:
            raise self.failure(
                f"cannot commit batch {last} (another writer committed to the table first)", exc
            ) from None
        except Exception as exc:
            raise self.failure(f"cannot commit batch {last}", exc) from None
        return {"num_source_rows": source.num_rows, "num_written_rows": rows.num_rows}

    def clear(self, batch: int) -> None:
        """Delete every row in one commit that says the table holds batches through
        ``batch`` (a repair that rolls back all the table's batches)."""
        from pyiceberg.expressions import AlwaysTrue

        summary = {APP_ID_KEY: self.app_id, BATCH_KEY: str(batch), _COMMIT_KEY: uuid.uuid4().hex}
        try:
            txn = self._for_commit().transaction()
            txn.delete(AlwaysTrue(), snapshot_properties=summary)
            # An empty append still makes a snapshot: the summary is there even when the
            # table held no row to delete.
            txn.append(self.schema.empty_table(), snapshot_properties=summary)
            txn.commit_transaction()
        except Exception as exc:
            raise self.failure("cannot empty the table", exc) from None

    def _for_commit(self) -> Table:
        table = self.open()
        # pyiceberg would retry a lost race by re-applying the staged overwrite on top of the
        # winner's rows, which the rows read for this commit do not include. Turned off on
        # this in-memory copy only; the batch then fails and the next run catches up.
        properties = {**table.metadata.properties, "commit.retry.num-retries": "0"}
        table.metadata = table.metadata.model_copy(update={"properties": properties})
        return table

    def _current_rows(
        self, table: Table, source: pa.Table
    ) -> tuple[BooleanExpression | None, pa.Table]:
        """The filter of the rows replaced (``None``: none) and the rows that replace them."""
        replaced = _sessions_filter(source)
        held = self._read(table, replaced)
        # Rows of the touched sessions the batch did not change are written again.
        untouched = held.filter(pc.invert(pc.is_in(_keys(held), _keys(source))))
        upserts = source.filter(pc.equal(source.column(ACTION_COLUMN), "upsert"))
        upserts = upserts.drop_columns(ACTION_COLUMN)
        rows = pa.concat_tables([untouched, upserts.cast(self.schema, safe=False)])
        return (replaced if held.num_rows else None), rows

    def _history_rows(
        self, table: Table, source: pa.Table
    ) -> tuple[BooleanExpression | None, pa.Table]:
        """The filter of the open versions replaced (``None``: none) and the rows written."""
        from pyiceberg.expressions import And

        action = source.column(ACTION_COLUMN)
        closes = source.filter(pc.equal(action, "close"))
        new = source.filter(pc.equal(action, "insert")).drop_columns(ACTION_COLUMN)
        new = new.cast(self.schema, safe=False)
        if closes.num_rows == 0:
            return None, new
        replaced: BooleanExpression = And(_sessions_filter(closes), _is_current())
        held = self._read(table, replaced)
        where = pc.index_in(_keys(held), value_set=_keys(closes))
        hit = pc.is_valid(where)
        kept = held.filter(pc.invert(hit))
        ending = held.filter(hit)
        at = pc.drop_null(where)
        for name in _CLOSING:
            column = closes.column(name).take(at).cast(self.schema.field(name).type)
            ending = ending.set_column(ending.schema.get_field_index(name), name, column)
        rows = pa.concat_tables([kept, ending.cast(self.schema, safe=False), new])
        return (replaced if held.num_rows else None), rows

    def _read(self, table: Table, where: BooleanExpression) -> pa.Table:
        rows = table.scan(row_filter=where).to_arrow()
        return rows.select(self.schema.names).cast(self.schema, safe=False)


#: Names the commit a snapshot belongs to (a commit may make two snapshots).
_COMMIT_KEY = "inorder.commit"


def _equal(column: str, value: Any) -> BooleanExpression:
    from pyiceberg.expressions import EqualTo, Reference
    from pyiceberg.expressions.literals import literal

    return EqualTo(term=Reference(column), value=literal(value))


def _is_current() -> BooleanExpression:
    return _equal("is_current", True)


def _sessions_filter(source: pa.Table) -> BooleanExpression:
    """Rows of the sessions in ``source``: a superset of its keys, narrowed in Arrow."""
    from pyiceberg.expressions import And, In, Or, Reference
    from pyiceberg.expressions.literals import literal

    terms: list[BooleanExpression] = []
    topics = source.column("topic")
    for topic in pc.unique(topics).to_pylist():
        sessions = pc.unique(source.column("session").filter(pc.equal(topics, topic)))
        names = sessions.to_pylist()
        on = (
            _equal("session", names[0])
            if len(names) == 1
            else In(term=Reference("session"), values={literal(n) for n in names})
        )
        terms.append(And(_equal("topic", topic), on))
    return _balanced(terms, Or)


def _balanced(terms: Sequence[BooleanExpression], join: Any) -> BooleanExpression:
    """``terms`` joined as a balanced tree (a deep one would exhaust the recursion limit)."""
    if len(terms) == 1:
        return terms[0]
    middle = len(terms) // 2
    joined: BooleanExpression = join(
        _balanced(terms[:middle], join), _balanced(terms[middle:], join)
    )
    return joined


def _keys(table: pa.Table) -> pa.Array:
    """One string per row: its ``(topic, session, row_id)``."""
    parts = [table.column(c).cast(pa.string()) for c in KEY_COLUMNS]
    joined = pc.binary_join_element_wise(*parts, _SEP)
    if isinstance(joined, pa.ChunkedArray):
        return joined.combine_chunks()
    return joined


def snapshot_commits(output: IcebergTableOutput, limit: int) -> dict[str, Any]:
    """The last batch an existing table holds and its newest ``limit`` commits (for
    ``inorder inspect``), read from the snapshot summaries of any pipeline."""
    table = output.open()
    snap = table.current_snapshot()
    doc: dict[str, Any] = {
        "version": None if snap is None else int(snap.snapshot_id),
        "last_batch": None,
        "commits": [],
    }
    for found, props in output.commits(table, any_app=True):
        if doc["last_batch"] is None:
            doc["last_batch"] = int(props[BATCH_KEY])
        if len(doc["commits"]) >= limit:
            break
        first = props.get(FIRST_BATCH_KEY)
        offsets = props.get(OFFSETS_KEY)
        doc["commits"].append(
            {
                "version": int(found.snapshot_id),
                "batch": int(props[BATCH_KEY]),
                "first_batch": None if first is None else int(first),
                "offsets": {} if offsets is None else json.loads(offsets),
                "timestamp": int(found.timestamp_ms),
            }
        )
    return doc
