"""What real sources do by design: redelivery is skipped exactly, drift and wrong keys are loud.

Debezium is at-least-once: after a connector restart it re-sends its last events with the
same source position. Those are duplicates (skipped, counted, never applied twice), while a
different event at an applied position stays a ``source_order`` violation. Debezium input
never restarts a table by itself, so ``restart_session`` is refused for it and its default
policy stops at a violation.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from tests.unit.test_debezium_envelope import PG_TABLE, fixture

from inorder.engine.reference import ReferenceRunner
from inorder.engine.rejections import check_rejections
from inorder.engine.results import TaskResult
from inorder.engine.violations import ViolationEvent
from inorder.errors import ConfigError
from inorder.integrity import MIN_REJECTED, Integrity
from inorder.integrity_fit import check_fits
from inorder.pipeline.progress import RunSummary, format_summary
from inorder.processor import Context, Duplicate, Processor
from inorder.records import KafkaRecord
from inorder.sessions import Change, Debezium, DebeziumCodec, SessionTables, rebuild_tables
from inorder.sessions.envelope_apply import REDELIVERY_WINDOW

T0 = datetime(2024, 11, 7, tzinfo=UTC)
DEAD_LETTER = Integrity.strict(on_violation="dead_letter")


def pg_event(op: str, row_id: int, name: str, lsn: int) -> bytes:
    """A PostgreSQL change event of the customers table at source position (lsn-100, lsn)."""
    _, value = fixture("postgres", "update")
    event = json.loads(value or b"")
    event["op"] = op
    event["after"] = None if op == "d" else {"id": row_id, "first_name": name}
    event["before"] = {"id": row_id}
    event["source"]["sequence"] = json.dumps([str(lsn - 100), str(lsn)])
    event["ts_ms"] = lsn  # the connector's own time differs on a redelivery: not compared
    return msgspec.json.encode(event)


def stream(events: list[bytes]) -> list[KafkaRecord]:
    return [KafkaRecord("dbz", 0, i, None, v, T0) for i, v in enumerate(events)]


def run(events: list[bytes], integrity: Integrity = DEAD_LETTER) -> ReferenceRunner:
    proc = SessionTables(envelope=Debezium())
    runner = ReferenceRunner(proc, proc.default_codec(), integrity)
    runner.run_batch(stream(events), 0, T0)
    return runner


def counted(runner: ReferenceRunner, name: str) -> int:
    return sum(b.counters.get(name, 0) for b in runner.result.batches)


def history(runner: ReferenceRunner) -> list[tuple[str, str | None]]:
    return [(r["op"], r["row_id"]) for r in runner.result.rows]


# Ten changes to three rows, positions 1000, 2000, ...
ORIGINAL = [pg_event("c" if i < 3 else "u", i % 3, f"v{i}", 1000 * (i + 1)) for i in range(10)]


def test_redelivered_events_are_skipped_and_counted_not_applied_twice() -> None:
    # A connector restart re-sends the last four events (the last one at the equal, last
    # position), then goes on with a new one.
    new = pg_event("u", 0, "after-restart", 11_000)
    runner = run(ORIGINAL + ORIGINAL[-4:] + [new])
    assert runner.result.violations == []
    assert counted(runner, "duplicates") == 4
    once = run([*ORIGINAL, new])
    assert history(runner) == history(once)  # no phantom history version
    rows = rebuild_tables(_table(runner))
    assert rows[("dbz", PG_TABLE)]["0"]["first_name"] == "after-restart"


def test_a_different_event_at_an_applied_position_is_a_violation() -> None:
    forged = pg_event("u", 1, "not-what-was-applied", 5000)  # 5000 held another event
    runner = run([*ORIGINAL, forged])
    assert [v.rule for v in runner.result.violations] == ["source_order"]
    assert "a different event was applied at this position" in runner.result.violations[0].detail
    assert counted(runner, "duplicates") == 0


def test_a_never_applied_older_position_is_a_violation() -> None:
    runner = run([*ORIGINAL, pg_event("u", 1, "x", 4500)])
    assert [v.rule for v in runner.result.violations] == ["source_order"]
    assert "never applied" in runner.result.violations[0].detail


def test_the_window_is_bounded_and_older_redelivery_is_still_skipped() -> None:
    many = [pg_event("u" if i else "c", 0, f"v{i}", 10 * (i + 1)) for i in range(1300)]
    runner = run([*many, many[0]])
    assert counted(runner, "duplicates") == 1
    state = next(iter(runner.final_state().values()))
    assert REDELIVERY_WINDOW <= len(state.recent) <= REDELIVERY_WINDOW * 5 // 4


def test_debezium_defaults_to_fail_and_refuses_restart_session() -> None:
    debezium = SessionTables(envelope=Debezium())
    assert debezium.default_integrity().on_violation == "fail"
    assert SessionTables().default_integrity().on_violation == "restart_session"
    with pytest.raises(ConfigError, match="Debezium sends no new snapshot"):
        check_fits(Integrity.strict(on_violation="restart_session"), debezium)
    check_fits(DEAD_LETTER, debezium)  # set aside, loudly: allowed
    check_fits(Integrity.strict(on_violation="restart_session"), SessionTables())


def test_output_changing_options_are_identity() -> None:
    plain = SessionTables().identity_options()
    assert plain == {"row_key": "id", "row_type": "", "envelope": ""}
    keyed = SessionTables(row_key="order_id", envelope=Debezium()).identity_options()
    assert keyed["row_key"] == "order_id" and "Debezium" in keyed["envelope"]


def _result(records: int, violations: dict[str, int], ignored: int = 0) -> TaskResult:
    rule = next(iter(violations), "undecodable")
    event = ViolationEvent("t", 0, 7, None, rule, "row has no 'order_id' field", "dead_letter")
    return TaskResult(
        topic="t",
        partition=0,
        records=records,
        violation_counts=violations,
        violations=[event],
        counters={"ignored": ignored},
    )


def test_a_batch_rejecting_most_records_stops_naming_the_setting() -> None:
    results = [_result(1232, {"undecodable": 1106})]
    with pytest.raises(ConfigError) as err:
        check_rejections(4, results, DEAD_LETTER)
    text = str(err.value)
    assert "batch 4: 1,106 of 1,232 records were rejected" in text
    assert "processor.options.row_key" in text and "Nothing of this batch was committed" in text
    # Records of reset sessions ignored afterwards are not counted (a state loss ignores
    # many by design); the resets themselves are.
    restart = Integrity.strict(on_violation="restart_session")
    check_rejections(0, [_result(1000, {"undecodable": 10}, ignored=900)], restart)
    with pytest.raises(ConfigError, match="600 of 1,000 records were rejected"):
        check_rejections(0, [_result(1000, {"undecodable": 600})], restart)


@pytest.mark.parametrize(
    ("records", "violations", "integrity"),
    [
        (1232, {"undecodable": 600}, DEAD_LETTER),  # under half
        (150, {"undecodable": MIN_REJECTED - 1}, DEAD_LETTER),  # too few to judge
        (1232, {"undecodable": 1106}, Integrity.strict(on_violation="fail")),
        (1232, {"undecodable": 1106}, Integrity.strict("dead_letter", reject_limit=1.0)),
    ],
)
def test_rejections_within_bounds_commit(
    records: int, violations: dict[str, int], integrity: Integrity
) -> None:
    check_rejections(0, [_result(records, violations)], integrity)


def test_a_run_that_set_data_aside_says_so() -> None:
    clean = RunSummary(policy="dead_letter", duplicates=3)
    assert not clean.set_aside
    assert "duplicates skipped (a source's redelivery): 3" in format_summary(clean)
    summary = RunSummary(
        policy="dead_letter", dead_letters=2, violations={"row_schema": 2},
        dead_letter_output="Parquet out_dead_letter",
    )  # fmt: skip
    assert summary.set_aside
    assert (
        "set aside: 2 integrity event(s) under on_violation = 'dead_letter'; 2 record(s) "
        "dead-lettered in Parquet out_dead_letter"
    ) in format_summary(summary)


def _table(runner: ReferenceRunner) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist(runner.result.rows)


@dataclasses.dataclass
class Seen:
    """How many changes a table had, and the last source position applied."""

    changes: int = 0
    position: list[int | str] | None = None


@dataclasses.dataclass
class SeenRow:
    table: str
    kafka_key: str
    changes: int


class CountChanges(Processor[Change, Seen, SeenRow]):
    """A user's own processor over Debezium events: the public codec and change type."""

    def key(self, msg: Change) -> str:
        return msg.session

    def initial_state(self, key: str) -> Seen:
        return Seen()

    def process(self, state: Seen, msg: Change, ctx: Context) -> Iterable[SeenRow]:
        if msg.tombstone:
            return []
        if msg.position is not None:
            here = list(msg.position)
            if state.position is not None and here <= state.position:
                raise Duplicate(f"{here} applied before")
            state.position = here
        state.changes += 1
        assert ctx.state_key == msg.session and ctx.kafka_key == ctx.key
        return [SeenRow(str(ctx.state_key), (ctx.kafka_key or b"").decode(), state.changes)]

    def default_codec(self) -> DebeziumCodec:
        return Debezium().codec("id")


def test_a_custom_processor_gets_typed_changes_positions_and_named_keys() -> None:
    _, tombstone = fixture("postgres", "tombstone")
    events = [*ORIGINAL, ORIGINAL[-1]]
    records = [KafkaRecord("dbz", 0, i, b'{"id": 1}', v, T0) for i, v in enumerate(events)]
    records.append(KafkaRecord("dbz", 0, len(records), b'{"id": 1}', tombstone, T0))
    proc = CountChanges()
    runner = ReferenceRunner(proc, proc.default_codec(), Integrity.strict())
    runner.run_batch(records, 0, T0)
    assert [r["changes"] for r in runner.result.rows] == list(range(1, 11))
    assert {r["table"] for r in runner.result.rows} == {PG_TABLE}
    assert runner.result.rows[0]["kafka_key"] == '{"id": 1}'
    assert counted(runner, "duplicates") == 1  # the re-sent last event; the tombstone skipped


def test_row_type_is_imported_from_the_working_directory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As processor.type is: a pipeline file's row type may live beside it.
    (tmp_path / "my_rows_beside_the_file.py").write_text(
        "from dataclasses import dataclass\n\n"
        "@dataclass\nclass Order:\n    id: int\n    total: float\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    proc = SessionTables(row_type="my_rows_beside_the_file:Order")
    assert proc.row_type is not None and proc.row_type.__name__ == "Order"
    with pytest.raises(ConfigError, match="row_type: module 'my_rows_beside_the_file' has no"):
        SessionTables(row_type="my_rows_beside_the_file:Missing")
