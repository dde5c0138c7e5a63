"""Fault matrix, data faults: what a real source does by design loses nothing; a wrong setting
stops loudly.

Debezium change events through the real broker into the change log and the current and
history Delta tables, read back with deltalake (through polars), independently of the code
that wrote them. Each case is one of docs/reliability.md's data faults:

1. a connector restart re-sends its last events: skipped as duplicates, the tables equal
   those of the same stream delivered once (no phantom history version);
2. under ``dead_letter`` likewise: a redelivery is not a violation;
3. a new column under ``row_type``: the run stops naming the field, nothing past it committed;
4. a wrong or non-unique ``row_key``: the run stops naming the setting before committing, and
   the fixed key (a recorded change, accepted) reads every record;
5. a run whose policy set data aside exits 3 and says what and where.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
import pytest

from inorder.assemble import build_pipeline
from inorder.commands.run import dump_toml
from inorder.errors import ConfigError, InorderError
from inorder.sessions.rebuild import read_changes
from inorder.sinks.parquet import read_committed
from tests.e2e.test_debezium_sessions import Event, produce, stream
from tests.faults.conftest import MatrixRecorder
from tests.faults.test_process_faults import verified
from tests.fixtures.sessions_job import sessions_config
from tests.integration.test_session_tables_iceberg import current_rows

SESSION = "postgres.inventory.customers"


@dataclasses.dataclass
class Customer:
    """The rows of :func:`~tests.e2e.test_debezium_sessions.stream`, typed."""

    id: int
    name: str
    n: int


def debezium_config(
    kafka: Any,
    prefix: str,
    work: Path,
    *,
    options: dict[str, Any] | None = None,
    iceberg: bool = False,
    **sections: Any,
) -> dict[str, Any]:
    tables = {"current": str(work / "current"), "history": str(work / "history")}
    if iceberg:
        tables = {
            "format": "iceberg",
            "current": "orders.current",
            "history": "orders.history",
            "warehouse": str(work / "warehouse"),
        }
    processor = {
        "type": "sessions",
        "options": {"envelope": {"kind": "debezium"}, **(options or {})},
    }
    return sessions_config(
        kafka.bootstrap_servers, prefix, work, max_offsets=120, processor=processor,
        tables=tables, **sections,
    )  # fmt: skip


def change_rows(work: Path, topic: str) -> list[tuple[str, str | None, str | None]]:
    """A topic's change rows in offset order, without the offsets (which differ by topic)."""
    table = pl.from_arrow(read_changes(str(work / "output")))
    assert isinstance(table, pl.DataFrame)
    mine = table.filter(pl.col("topic") == topic).sort("offset")
    return list(zip(mine["op"], mine["row_id"], mine["row"], strict=True))


def current_table(work: Path, iceberg: bool) -> pl.DataFrame | None:
    """The current table as written (Delta or Iceberg), ``None`` before it exists."""
    if iceberg:
        if not (work / "warehouse" / "catalog.db").exists():
            return None
        try:
            return iceberg_table(work / "warehouse", "orders.current")
        except Exception as exc:  # NoSuchTableError: not created yet
            if type(exc).__name__ == "NoSuchTableError":
                return None
            raise
    current = work / "current"
    return pl.read_delta(str(current)) if current.exists() else None


def nothing_committed(work: Path, iceberg: bool = False) -> bool:
    """No change row committed, and the current table (when created) empty."""
    current = current_table(work, iceberg)
    empty = current is None or current.height == 0
    return empty and read_committed(str(work / "output")).num_rows == 0


def iceberg_table(warehouse: Path, name: str) -> pl.DataFrame:
    """An Iceberg table of the embedded catalog, read with pyiceberg alone."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        "inorder", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    frame = pl.from_arrow(catalog.load_table(name).scan().to_arrow())
    assert isinstance(frame, pl.DataFrame)
    return frame


def table_rows(frame: pl.DataFrame) -> dict[tuple[str, str], Any]:
    """A current table as ``{(topic, session): {row_id: row}}`` (no duplicate key)."""
    return current_rows(frame.to_arrow())


@pytest.mark.parametrize(("policy", "tables"), [("", "delta"), ("dead_letter", "iceberg")])
def test_redelivery_is_skipped_exactly(
    policy: str, tables: str, kafka: Any, spark: Any, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    prefix = f"redeliver-{policy[:4]}-{random.randrange(10**9)}-"
    again = kafka.new_topic(f"{prefix}again")
    once = kafka.new_topic(f"{prefix}once")
    events, truth = stream("postgres", 7, rows=30, changes=240)
    # A connector restart: the last 10 events before it are sent again, then 100 new ones.
    cut = len(events) - 100
    produce(kafka.bootstrap_servers, again, events[:cut] + events[cut - 10 : cut] + events[cut:])
    produce(kafka.bootstrap_servers, once, events)
    integrity = {"integrity": {"on_violation": policy}} if policy else {}
    iceberg = tables == "iceberg"
    config = debezium_config(kafka, prefix, tmp_path, iceberg=iceberg, **integrity)
    summary = build_pipeline(config).run()

    assert summary.violations == {} and not summary.set_aside
    # Tombstones carry no position: skipped by contract, not counted as duplicates.
    assert summary.duplicates == sum(value is not None for _, value in events[cut - 10 : cut])
    assert change_rows(tmp_path, again) == change_rows(tmp_path, once)
    if iceberg:
        current = table_rows(iceberg_table(tmp_path / "warehouse", "orders.current"))
        history = iceberg_table(tmp_path / "warehouse", "orders.history")
    else:
        current = table_rows(pl.read_delta(str(tmp_path / "current")))
        history = pl.read_delta(str(tmp_path / "history"))
    assert current[(again, SESSION)] == current[(once, SESSION)] == truth
    versions = dict(history.group_by("topic").len().iter_rows())
    assert versions[again] == versions[once]  # no version that never existed
    proof_ok, proof = verified(tmp_path / "pipeline.toml", config)
    matrix.record(
        group="data", fault=f"Debezium redelivers its last 10 events after a restart "
        f"(on_violation = {policy or 'default: fail'}, {tables} tables)", times=1,
        outcome="continued", ok=proof_ok,
        check=f"{summary.duplicates} duplicates skipped; change log, current and history tables "
        f"equal to the stream delivered once; exit 0; {proof}",
    )  # fmt: skip
    assert proof_ok, proof


@pytest.mark.parametrize("tables", ["delta", "iceberg"])
def test_a_new_column_under_row_type_stops_before_commit(
    tables: str, kafka: Any, spark: Any, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    prefix = f"drift-{random.randrange(10**9)}-"
    topic = kafka.new_topic(f"{prefix}orders")
    events, _ = stream("postgres", 8, rows=20, changes=300)
    drift_at = 200
    events.insert(drift_at, _drifted_create(events[:drift_at], "discount", 5))
    produce(kafka.bootstrap_servers, topic, events)
    options = {"row_type": "tests.faults.test_data_faults:Customer"}
    iceberg = tables == "iceberg"
    config = debezium_config(kafka, prefix, tmp_path, options=options, iceberg=iceberg)
    with pytest.raises(InorderError, match=r"schema_drift .*discount.* add them to Customer"):
        build_pipeline(config).run()
    committed = read_changes(str(tmp_path / "output"))
    assert committed.num_rows > 0
    assert max(committed.column("offset").to_pylist()) < drift_at  # nothing past it
    current = current_table(tmp_path, iceberg)
    assert current is not None and current.height > 0
    assert current["offset"].max() < drift_at  # type: ignore[operator]
    proof_ok, proof = verified(tmp_path / "pipeline.toml", config)  # what was committed
    matrix.record(
        group="data", fault=f"a new column mid-stream under row_type ({tables} tables)", times=1,
        outcome="named error", ok=proof_ok,
        check="stopped naming schema_drift and the field; nothing from that record on "
        f"committed; {proof}",
    )  # fmt: skip
    assert proof_ok, proof


@pytest.mark.parametrize(
    ("row_key", "rule", "tables"),
    [("order_id", "undecodable", "delta"), ("n", "insert_existing_row", "iceberg")],
)
def test_a_wrong_or_non_unique_key_stops_naming_the_setting(
    row_key: str,
    rule: str,
    tables: str,
    kafka: Any,
    spark: Any,
    tmp_path: Path,
    matrix: MatrixRecorder,
) -> None:
    prefix = f"wrongkey-{row_key}-{random.randrange(10**9)}-"
    topic = kafka.new_topic(f"{prefix}orders")
    events, truth = stream("postgres", 9, rows=30, changes=200)
    produce(kafka.bootstrap_servers, topic, events)
    wrong = {"row_key": row_key}
    iceberg = tables == "iceberg"
    # The default policy for Debezium stops at the first violation, committing nothing.
    with pytest.raises(InorderError, match=rule):
        build_pipeline(
            debezium_config(kafka, prefix, tmp_path, options=wrong, iceberg=iceberg)
        ).run()
    assert nothing_committed(tmp_path, iceberg)
    if row_key == "order_id":
        # Setting records aside instead: a batch that rejects nearly all of them stops too.
        lenient = {"integrity": {"on_violation": "dead_letter"}}
        with pytest.raises(ConfigError, match=r"check the codec .* or processor\.options\.row_key"):
            build_pipeline(debezium_config(kafka, prefix, tmp_path, options=wrong, **lenient)).run()
        assert nothing_committed(tmp_path, iceberg)
    # The key fixed: the options are part of the checkpoint's identity, so the change is
    # refused until accepted; then every record is read.
    fixed = debezium_config(kafka, prefix, tmp_path, iceberg=iceberg)
    with pytest.raises(ConfigError, match="processor options: checkpoint has"):
        build_pipeline(fixed).run()
    summary = build_pipeline(fixed).run(accept_changes=True)
    assert summary.records == len(events)
    current = current_table(tmp_path, iceberg)
    assert current is not None and table_rows(current) == {(topic, SESSION): truth}
    proof_ok, proof = verified(tmp_path / "pipeline.toml", fixed)
    kind = "a wrong" if row_key == "order_id" else "a non-unique"
    lenient_note = (
        " (and, under dead_letter, at the batch rejecting most records)"
        if row_key == "order_id"
        else ""
    )
    matrix.record(
        group="data", fault=f"{kind} row_key ({row_key!r}, {tables} tables)", times=1,
        outcome="named error",
        ok=proof_ok, check=f"stopped at the first {rule}{lenient_note} with nothing committed; "
        "the fixed key refused until accepted, then every record read and the table equal to "
        f"the truth; {proof}",
    )  # fmt: skip
    assert proof_ok, proof


def test_a_run_that_set_data_aside_exits_3_and_says_where(
    kafka: Any, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    prefix = f"setaside-{random.randrange(10**9)}-"
    topic = kafka.new_topic(f"{prefix}orders")
    events, _ = stream("postgres", 10, rows=10, changes=40)
    events.insert(20, (None, b'{"op": "c", "not json'))
    produce(kafka.bootstrap_servers, topic, events)
    config = debezium_config(kafka, prefix, tmp_path, integrity={"on_violation": "dead_letter"})
    config["pipeline"].update(progress="plain", set_aside_exit_code=3)  # the default
    toml = tmp_path / "pipeline.toml"
    done = run_cli(toml, config)
    assert done.returncode == 3, done.stderr
    assert "set aside: 1 integrity event(s) under on_violation = 'dead_letter'" in done.stderr
    assert f"1 record(s) dead-lettered in Parquet dataset {tmp_path}/output_dead_letter" in (
        done.stderr
    )
    # A pipeline that opts out (set_aside_exit_code = 0) exits 0 though it sets aside more.
    produce(kafka.bootstrap_servers, topic, [(None, b"not an event")])
    config["pipeline"]["set_aside_exit_code"] = 0
    again = run_cli(toml, config)
    assert again.returncode == 0, again.stderr
    assert "set aside: 1 integrity event(s)" in again.stderr
    proof_ok, proof = verified(toml)  # the change log and the dead letters
    matrix.record(
        group="data", fault="an undecodable event under dead_letter", times=1,
        outcome="policy action", ok=proof_ok,
        check="dead-lettered; exit 3 and the summary's set-aside line names the dead-letter "
        f"output; 0 with set_aside_exit_code = 0; {proof}",
    )  # fmt: skip
    assert proof_ok, proof


def run_cli(toml: Path, config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``inorder run`` of ``config`` written to ``toml``, in a process of its own."""
    toml.write_text(dump_toml(config))
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", "run", str(toml)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _drifted_create(before: list[Event], field: str, value: Any) -> Event:
    """A create just after the last event of ``before``, its row holding one field more."""
    key, raw = next(e for e in reversed(before) if e[1] is not None)
    doc = json.loads(raw or b"")
    payload = doc.get("payload", doc)
    lsn = int(json.loads(payload["source"]["sequence"])[1]) + 1
    payload["source"]["sequence"] = json.dumps([str(lsn - 5), str(lsn)])
    payload.update(op="c", before=None, after={"id": 10**6, "name": "new", "n": 0, field: value})
    return key, msgspec.json.encode(doc)
