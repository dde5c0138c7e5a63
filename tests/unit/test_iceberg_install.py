"""Iceberg without pyiceberg, and reading a sink's table with pyiceberg alone.

pyiceberg is an optional dependency (``inorder[iceberg]``): without it the Iceberg sink and
catalog refuse with one line naming the install command. The sink's SQL catalog is opened
under the name ``inorder``, which an outside pyiceberg reader must use as well (the SQL
catalog keys its tables by catalog name), as docs/sinks.md and docs/tables.md say.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from inorder.errors import ConfigError
from inorder.sinks.iceberg import IcebergSink
from inorder.sinks.iceberg_catalog import CATALOG_NAME, catalog_properties, open_catalog

HINT = "pip install 'inorder[iceberg]'"


@pytest.fixture
def no_pyiceberg(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyiceberg as if it were not installed (``import pyiceberg`` fails)."""
    monkeypatch.setitem(sys.modules, "pyiceberg", None)


@pytest.mark.usefixtures("no_pyiceberg")
def test_sink_without_pyiceberg_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        IcebergSink("analytics.sessions", str(tmp_path / "warehouse"))
    message = str(err.value)
    assert HINT in message
    assert "\n" not in message
    assert message.startswith("the Iceberg sink needs pyiceberg")


@pytest.mark.usefixtures("no_pyiceberg")
def test_catalog_without_pyiceberg_names_the_extra(tmp_path: Path) -> None:
    props = catalog_properties(None, str(tmp_path / "warehouse"), None, None)
    with pytest.raises(ConfigError, match=r"pip install 'inorder\[iceberg\]'"):
        open_catalog(props)


def test_outside_reader_opens_the_catalog_named_inorder(tmp_path: Path) -> None:
    """The reading recipe of docs/sinks.md, run against a table the sink created."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    warehouse = tmp_path / "warehouse"
    sink = IcebergSink("analytics.sessions", str(warehouse))
    sink.bind("ckpt")
    sink.check(pa.schema([pa.field("topic", pa.string()), pa.field("n", pa.int64())]))
    assert sink.commit(0, [])  # an empty batch is a snapshot too

    assert CATALOG_NAME == "inorder"
    catalog = SqlCatalog(
        "inorder", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    table = catalog.load_table("analytics.sessions")
    snapshots = table.snapshots()
    assert len(snapshots) == 1  # one snapshot per batch
    summary = table.current_snapshot().summary.additional_properties
    assert summary["inorder.app-id"] == "inorder-ckpt"
    assert summary["inorder.batch-id"] == "0"
    assert table.scan().to_arrow().num_rows == 0

    other = SqlCatalog(
        "default", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    with pytest.raises(NoSuchTableError):
        other.load_table("analytics.sessions")


def test_session_tables_read_with_pyiceberg_alone(tmp_path: Path) -> None:
    """docs/tables.md: the tables open under the catalog name ``inorder``; every snapshot of
    one commit carries the batch's summary and the same ``inorder.commit``; a commit is one
    to three snapshots."""
    from pyiceberg.catalog.sql import SqlCatalog
    from tests.integration.test_materializer import SCHEMA, ChangeLog, commit

    from inorder.sessions import SessionTables
    from inorder.sessions.tables_writer import SessionTablesWriter, TableOutputs
    from inorder.sinks.delta import DeltaSink

    changes = DeltaSink(str(tmp_path / "changes"), partition_by=["topic"])
    changes.check(SCHEMA)
    warehouse = tmp_path / "warehouse"
    outputs = TableOutputs(
        current="sessions.current",
        history="sessions.history",
        format="iceberg",
        warehouse=str(warehouse),
    )
    writer = SessionTablesWriter(SessionTables(), changes, outputs)
    writer.check()
    log = ChangeLog(seed=3, sessions=6)
    batches = 5
    for b in range(batches):
        commit(changes, b, log.batch(b, messages=30))
        writer.after_commit(b)

    catalog = SqlCatalog(
        "inorder", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    for name in ("sessions.current", "sessions.history"):
        table = catalog.load_table(name)
        assert table.scan().to_arrow().num_rows > 0
        commits: dict[str, list[dict[str, str]]] = {}
        for snap in table.snapshots():
            props = dict(snap.summary.additional_properties)
            props["operation"] = snap.summary.operation.value
            commits.setdefault(props["inorder.commit"], []).append(props)
        assert len(commits) <= batches
        for snaps in commits.values():
            assert 1 <= len(snaps) <= 3
            assert snaps[-1]["operation"] == "append"
            assert all(s["operation"] in ("delete", "overwrite") for s in snaps[:-1])
            keys = ("inorder.app-id", "inorder.batch", "inorder.first_batch", "inorder.offsets")
            assert len({tuple(s[k] for k in keys) for s in snaps}) == 1
        assert any(len(snaps) > 1 for snaps in commits.values())

    # The as-of filter of docs/tables.md, as a pyiceberg row filter string.
    as_of = (
        catalog.load_table("sessions.history")
        .scan(
            row_filter="topic = 'site-0' AND valid_from_offset <= 1000 "
            "AND (valid_to_offset IS NULL OR valid_to_offset > 1000)"
        )
        .to_arrow()
    )
    assert as_of.num_rows > 0
    assert set(as_of.column("topic").to_pylist()) == {"site-0"}


@pytest.mark.usefixtures("no_pyiceberg")
def test_session_tables_without_pyiceberg_name_the_extra(tmp_path: Path) -> None:
    from inorder.sessions.tables_iceberg import IcebergTableOutput

    props = catalog_properties(None, str(tmp_path / "warehouse"), None, None)
    schema = pa.schema([pa.field("topic", pa.string())])
    with pytest.raises(
        ConfigError, match=r"^Iceberg session tables needs pyiceberg.*inorder\[iceberg\]"
    ):
        IcebergTableOutput("current", "sessions.current", schema, props)


def test_a_relative_local_warehouse_is_recorded_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The catalog records table locations as the warehouse is written: a relative one would
    # be found only from the directory the pipeline ran in.
    from inorder.sinks.iceberg_catalog import catalog_properties

    monkeypatch.chdir(tmp_path)
    props = catalog_properties(None, "out/wh", None, None)
    assert props["warehouse"] == str(tmp_path / "out" / "wh")
    assert props["uri"] == f"sqlite:///{tmp_path / 'out' / 'wh' / 'catalog.db'}"
    uri = catalog_properties(None, "file://out/wh", "cat.db", None)
    assert uri["warehouse"] == f"file://{tmp_path / 'out' / 'wh'}"
    assert uri["uri"] == f"sqlite:///{tmp_path / 'cat.db'}"
    s3 = catalog_properties(None, "s3://bucket/wh", "cat.db", None)
    assert s3["warehouse"] == "s3://bucket/wh"
