"""The ordered-apply core through the reference runner: order, timers, policies, replays."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest
from tests.property.procs import Msg, MsgCodec, Row, Tallier, Tally, record

from inorder.engine.reference import ReferenceRunner
from inorder.errors import InorderError, IntegrityError
from inorder.integrity import Integrity
from inorder.processor import Context, Processor
from inorder.records import KafkaRecord


def run(
    batches: list[list[KafkaRecord]],
    integrity: Integrity | None = None,
    times: list[float] | None = None,
    processor: Processor[Any, Any, Any] | None = None,
) -> ReferenceRunner:
    runner = ReferenceRunner(processor or Tallier(), MsgCodec(), integrity or Integrity.strict())
    when = [datetime.fromtimestamp(t, UTC) for t in (times or [0.0] * len(batches))]
    runner.run(batches, when)
    return runner


def kinds(runner: ReferenceRunner) -> list[tuple[str, str, int, int]]:
    return [(r["k"], r["kind"], r["n"], r["offset"]) for r in runner.result.rows]


def test_rows_carry_origin_and_follow_offset_order() -> None:
    r = run([[record(0, "a", v=1), record(3, "b", v=2), record(4, "a", v=3)]])
    assert [(x["topic"], x["partition"], x["offset"], x["batch_id"]) for x in r.result.rows] == [
        ("t", 0, 0, 0),
        ("t", 0, 3, 0),
        ("t", 0, 4, 0),
    ]
    assert r.final_state()[("t", 0, "a")] == Tally(2, 4, [1, 3])


def test_gaps_are_not_violations_and_replays_are_skipped() -> None:
    r = run([[record(0, "a"), record(10, "a")], [record(5, "a"), record(10, "a"), record(11, "a")]])
    assert [x["offset"] for x in r.result.rows] == [0, 10, 11]
    assert r.result.violations == []
    assert r.result.batches[1].counters["replayed"] == 2


def test_event_time_timer_fires_before_the_record_that_passes_it() -> None:
    # add arms a timeout 10 s after the record's event time; the watermark is max event time.
    r = run([[record(0, "a", t=0), record(1, "b", t=5), record(2, "c", t=20)]])
    assert kinds(r) == [
        ("a", "add", 1, 0),
        ("b", "add", 1, 1),
        ("a", "timeout", 1, 0),  # deadline 10, then b's deadline 15: ordered by deadline
        ("b", "timeout", 1, 1),
        ("c", "add", 1, 2),
    ]
    assert r.result.rows[2]["note"] == datetime.fromtimestamp(20, UTC).isoformat()


def test_event_timers_ordered_by_deadline_then_key() -> None:
    r = run([[record(0, "b", t=0), record(1, "a", t=0), record(2, "c", t=50)]])
    assert [x["k"] for x in r.result.rows if x["kind"] == "timeout"] == ["a", "b"]


def test_watermark_does_not_go_back() -> None:
    r = run([[record(0, "a", t=100), record(1, "b", t=0), record(2, "c", t=105)]])
    # b's deadline (10) is already behind the watermark (100): it fires at the next rise.
    assert [(x["k"], x["kind"]) for x in r.result.rows] == [
        ("a", "add"),
        ("b", "add"),
        ("b", "timeout"),
        ("c", "add"),
    ]
    r2 = run([[record(0, "a", t=100), record(1, "b", t=0)], [record(2, "c", t=111)]])
    assert [(x["k"], x["kind"]) for x in r2.result.rows][2:] == [
        ("b", "timeout"),
        ("a", "timeout"),
        ("c", "add"),
    ]


def test_processing_time_timer_fires_at_end_of_a_later_batch_even_without_records() -> None:
    r = run([[record(0, "a", op="pt", v=5)], [], []], times=[0, 3, 6])
    assert kinds(r) == [("a", "pt", 1, 0), ("a", "timeout", 1, 0)]
    assert r.result.rows[1]["batch_id"] == 2


def test_clear_timeout_and_reset_session() -> None:
    r = run([[record(0, "a", t=0), record(1, "a", op="clear", t=1), record(2, "b", t=50)]])
    assert "timeout" not in [x["kind"] for x in r.result.rows]
    r = run([[record(0, "a"), record(1, "a", op="end"), record(2, "a")]])
    assert [x["n"] for x in r.result.rows] == [1, 2, 1]


def test_fail_policy_names_topic_partition_offset_key_rule() -> None:
    with pytest.raises(IntegrityError) as info:
        run([[record(0, "a"), record(1, "a", op="bad", v=7)]])
    assert str(info.value) == (
        "integrity violation: bad_value at t[0] offset 1 (key 'a'): value 7 is bad"
    )


def test_failed_batch_keeps_nothing() -> None:
    runner = ReferenceRunner(Tallier(), MsgCodec(), Integrity.strict())
    runner.run_batch([record(0, "a", v=1)], 0, datetime.fromtimestamp(0, UTC))
    with pytest.raises(IntegrityError):
        runner.run_batch([record(1, "a", v=1), record(2, "a", op="bad")], 1, datetime.now(UTC))
    assert runner.final_state()[("t", 0, "a")] == Tally(1, 1, [1])
    assert runner.meta[next(iter(runner.meta))].last_offset == 0


def test_undecodable_is_a_violation_with_the_record_key() -> None:
    with pytest.raises(IntegrityError, match=r"undecodable at t\[0\] offset 1 \(key 'a'\)"):
        run([[record(0, "a"), record(1, "a", raw=b"\xff")]])


def test_dead_letter_rolls_back_state_and_continues() -> None:
    r = run(
        [[record(0, "a", v=1), record(1, "a", op="bad", v=5), record(2, "a", v=2)]],
        Integrity.strict(on_violation="dead_letter"),
    )
    assert [x["total"] for x in r.result.rows] == [1, 3]
    assert r.final_state()[("t", 0, "a")] == Tally(2, 3, [1, 2])
    [(_, letter)] = r.result.dead_letters
    assert (letter.offset, letter.rule, letter.key) == (1, "bad_value", "a")


def test_restart_session_drops_key_until_a_new_session() -> None:
    r = run(
        [
            [
                record(0, "a", v=1),
                record(1, "b", v=1),
                record(2, "a", op="bad"),
                record(3, "a", v=9),
                record(4, "b", v=1),
                record(5, "a", op="start", v=2),
                record(6, "a", v=1),
            ]
        ],
        Integrity.strict(on_violation="restart_session"),
    )
    assert kinds(r) == [
        ("a", "add", 1, 0),
        ("b", "add", 1, 1),
        ("a", "reset", 0, 2),
        ("b", "add", 2, 4),
        ("a", "start", 1, 5),
        ("a", "add", 2, 6),
    ]
    assert r.result.batches[0].counters["ignored"] == 1


def test_sequence_field_gap_repeat_and_session_restart() -> None:
    integrity = Integrity.strict(on_violation="dead_letter", sequence_field="seq")
    r = run(
        [
            [
                record(0, "a", seq=0),
                record(1, "a", seq=1),
                record(2, "a", seq=3),  # gap
                record(3, "a", seq=1),  # repeat
                record(4, "a", seq=2),
                record(5, "a", seq=0, op="start"),  # a new session may restart
                record(6, "a", seq=1),
            ]
        ],
        integrity,
    )
    assert [x["offset"] for x in r.result.rows] == [0, 1, 4, 5, 6]
    assert r.result.batches[0].violation_counts == {"sequence_gap": 1, "sequence_repeat": 1}


def test_timeout_rows_carry_last_offset_of_their_key() -> None:
    r = run([[record(7, "a", t=0), record(9, "b", t=1)], [record(12, "c", t=30)]])
    timeouts = [(x["k"], x["offset"]) for x in r.result.rows if x["kind"] == "timeout"]
    assert timeouts == [("a", 7), ("b", 9)]


def test_partitions_are_independent() -> None:
    r = run([[record(0, "a", partition=0), record(0, "a", partition=1), record(1, "a")]])
    state = r.final_state()
    assert state[("t", 0, "a")].n == 2 and state[("t", 1, "a")].n == 1


class Buggy(Processor[Msg, Tally, Row]):
    def key(self, msg: Msg) -> str:
        return msg.k

    def initial_state(self, key: str) -> Tally:
        return Tally()

    def process(self, state: Tally, msg: Msg, ctx: Context) -> list[Row]:
        raise ZeroDivisionError("boom")


def test_processor_exception_stops_whatever_the_policy() -> None:
    with pytest.raises(InorderError, match=r"processor failed at t\[0\] offset 0 \(key 'a'\)"):
        run([[record(0, "a")]], Integrity.strict(on_violation="dead_letter"), processor=Buggy())


class HalfTallier(Tallier):
    """Yields a float into the int field ``total`` for op ``half`` (a bug users make)."""

    def process(self, state: Tally, msg: Msg, ctx: Context) -> Iterable[Row]:
        if msg.op != "half":
            yield from super().process(state, msg, ctx)
            return
        state.n += 1
        yield Row(msg.k, "half", state.n, msg.v / 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["fail", "restart_session", "dead_letter"])
def test_a_row_that_does_not_fit_is_a_row_schema_violation(policy: str) -> None:
    """Before: 32.37 was written as 32 into the int column, silently."""
    batches = [[record(0, "a", v=2), record(1, "a", v=5, op="half"), record(2, "a", v=1)]]
    integrity = Integrity.strict(on_violation=policy)  # type: ignore[arg-type]
    if policy == "fail":
        with pytest.raises(IntegrityError, match=r"row_schema.*Row\.total: float value 2\.5"):
            run(batches, integrity, processor=HalfTallier())
        return
    r = run(batches, integrity, processor=HalfTallier())
    [event] = r.result.violations
    assert (event.rule, event.offset, event.key) == ("row_schema", 1, "a")
    assert "Row.total: float value 2.5 does not fit int" in event.detail
    assert all(isinstance(x["total"], int) for x in r.result.rows)
    assert 1 not in [x["offset"] for x in r.result.rows if x["kind"] != "reset"]
    if policy == "dead_letter":
        [(_, letter)] = r.result.dead_letters
        assert (letter.offset, letter.rule) == (1, "row_schema")
        # The key's state is as before the bad call: the third record counts 2, not 3.
        assert r.final_state()[("t", 0, "a")].n == 2
