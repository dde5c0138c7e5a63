"""The status page's pure parts: partition and batch rows, integrity events with their replay
commands, the batch history file and its bound, and escaping in the rendered page."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path

from inorder.checkpoint import CheckpointLayout
from inorder.checkpoint.spark_log import SparkBatch
from inorder.ops.batchlog import BatchEntry, BatchLog
from inorder.ops.inspect import PartitionStateInfo, batches
from inorder.pipeline.batch_history import HISTORY_FILE, BatchHistory, read_history
from inorder.pipeline.progress import BatchProgress
from inorder.records import TopicPartition
from inorder.ui.page import render_live
from inorder.ui.rows import (
    batch_rows,
    events_by_partition,
    integrity_events,
    parse_tp,
    partition_rows,
    replay_command,
)

A0, A1 = TopicPartition("site-a", 0), TopicPartition("site-a", 1)


def _batch(
    batch_id: int,
    end: dict[TopicPartition, int],
    committed: bool,
    planned_at: float,
    committed_at: float | None,
    starts: dict[TopicPartition, int] | None = None,
) -> BatchEntry:
    spark = SparkBatch(batch_id, {}, committed, planned_at, committed_at, end, starts or {})
    return BatchEntry(spark)


def _log() -> BatchLog:
    """Three committed batches 10 s apart, each taking 2 s; A1 reads nothing in batch 2."""
    return BatchLog(
        [
            _batch(0, {A0: 100, A1: 50}, True, 1000.0, 1002.0, {A0: 0, A1: 0}),
            _batch(1, {A0: 300, A1: 90}, True, 1010.0, 1012.0),
            _batch(2, {A0: 400, A1: 90}, True, 1020.0, 1022.0),
            _batch(3, {A0: 450, A1: 95}, False, 1030.0, None),
        ]
    )


def test_parse_tp_and_replay_command() -> None:
    assert parse_tp("site-a[3]") == TopicPartition("site-a", 3)
    assert parse_tp("odd[name[12]") == TopicPartition("odd[name", 12)
    assert parse_tp("site-a") is None and parse_tp("site-a[x]") is None
    command = replay_command("my pipeline.toml", A0, 5, 9, on_violation=True)
    assert shlex.split(command) == [
        "inorder", "replay", "my pipeline.toml", "--topic", "site-a", "--partition", "0",
        "--from-offset", "5", "--to-offset", "9", "--break-on-violation",
    ]  # fmt: skip


def test_partition_rows() -> None:
    log = _log()
    state = [PartitionStateInfo("site-a", 0, 2, 7, 1, 700, 900)]
    rows = partition_rows(log, batches(log), {A0: 460, A1: 90}, None, state, {A1: 3})
    a0, a1 = rows
    assert (a0.committed, a0.end_offset, a0.lag) == (400, 460, 60)
    # 400 records in the three batches' 2 s each (the pauses between them not counted).
    assert a0.records_per_second == round(400 / 6, 1)
    assert a0.last_batch_at == "1970-01-01T00:17:02+00:00"
    assert (a0.state_keys, a0.state_bytes, a0.events) == (7, 700, 0)
    # A1's last batch with records was batch 1; the broker's end is below the committed
    # offset (records deleted): the lag is 0, never negative.
    assert a1.last_batch_at == "1970-01-01T00:16:52+00:00" and a1.lag == 0
    assert (a1.state_keys, a1.events) == (None, 3)
    # Without the broker, the lag Spark saw is shown.
    rows = partition_rows(log, batches(log), None, {"site-a[0]": 12}, [], {})
    assert [(r.end_offset, r.lag) for r in rows] == [(None, 12), (None, None)]


def test_batch_rows_join_history_and_output() -> None:
    infos = batches(_log())
    history = {1: {"output_rows": 9, "output_files": 2, "seconds": {"apply": 0.5}}}
    # Output batch ids are shifted by 100 (a repaired checkpoint).
    rows = batch_rows(infos, history, {100: (40, 1), 102: (7, 3)}, 100)
    assert [(r.batch_id, r.output_batch_id) for r in rows] == [
        (0, 100),
        (1, 101),
        (2, 102),
        (3, 103),
    ]
    assert [(r.output_rows, r.output_files) for r in rows] == [
        (40, 1),
        (9, 2),
        (7, 3),
        (None, None),
    ]
    assert rows[1].seconds == {"apply": 0.5} and rows[0].records == 150
    assert [r.committed for r in rows] == [True, True, True, False]
    assert [r.state for r in rows] == ["committed"] * 3 + ["not committed"]


def test_a_batch_re_run_after_its_output_committed_shows_the_output_s_rows() -> None:
    # The re-run's line: the sink had committed batch 2 before a crash, so it wrote nothing.
    history = {2: {"committed": False, "output_rows": 0, "output_files": 0, "records": 0}}
    rows = batch_rows(batches(_log()), history, {2: (7, 3)}, 0)
    assert (rows[2].output_rows, rows[2].output_files) == (7, 3)
    # A Delta output has no per-batch counts: unknown, not 0.
    rows = batch_rows(batches(_log()), history, None, 0)
    assert (rows[2].output_rows, rows[2].output_files) == (None, None)


def test_records_per_second_count_the_time_batches_ran_not_the_pauses() -> None:
    # A small first batch, then the next trigger a minute later reads a backlog: 60,000
    # records in 2 s. The rate is 60,010 records over the 4 s the batches ran, not over the
    # 62 s since the small batch was planned.
    log = BatchLog(
        [
            _batch(0, {A0: 10}, True, 1000.0, 1002.0, {A0: 0}),
            _batch(1, {A0: 60_010}, True, 1060.0, 1062.0),
        ]
    )
    (row,) = partition_rows(log, batches(log), {A0: 60_010}, None, [], {})
    assert row.records_per_second == round(60_010 / 4, 1)
    # A batch committed by a later run than the one that planned it: its recorded
    # duration counts, not the days between the runs.
    log.batches.append(_batch(2, {A0: 70_010}, True, 2000.0, 90_000.0))
    infos = batches(log, history={2: {"duration_seconds": 1.0}}, run_started=80_000.0)
    (row,) = partition_rows(log, infos, {A0: 70_010}, None, [], {})
    assert row.records_per_second == round(70_010 / 5, 1)


def _states(running: bool | None, output: dict[int, tuple[int, int]]) -> list[object]:
    log = _log()  # batch 3 is planned, not committed by Spark
    history = {3: {"output_rows": 99, "output_files": 9}}  # another attempt's line
    rows = batch_rows(batches(log), history, output, 0, running)
    return [(r.state, r.output_committed, r.output_rows) for r in rows[2:]]


def test_batch_states_say_what_is_true() -> None:
    # The batch in flight is running; its output rows are unknown until it commits.
    assert _states(True, {}) == [("committed", False, 0), ("running", False, None)]
    # Stopped while it was planned: the next start re-runs it.
    assert _states(False, {}) == [("committed", False, 0), ("interrupted", False, None)]
    # The sink committed its output, Spark's commit has not followed yet: the rows are
    # shown, and the state says they are in the output.
    assert _states(True, {3: (5, 1)}) == [("committed", False, 0), ("running", True, 5)]
    running = _page_batches(True, {})
    assert 'class="running" data-field="state">running<' in running
    assert 'class="bad"' not in running and "not committed" not in running
    interrupted = _page_batches(False, {3: (5, 1)})
    assert "interrupted: re-run at the next start · output committed" in interrupted
    assert 'class="bad"' not in interrupted


def _page_batches(running: bool, output: dict[int, tuple[int, int]]) -> str:
    rows = batch_rows(batches(_log()), {}, output, 0, running)
    doc = {
        "checkpoint": "c", "broker": "reachable", "running": running,
        "last_committed_batch": 2, "batches_in_log": 4, "partitions": [],
        "batches": [asdict(r) for r in rows], "events": [], "resets": [],
        "history_recorded": True, "state": [],
        "output": {"kind": "parquet", "location": "o", "files": 1, "rows": 1, "bytes": 1},
    }  # fmt: skip
    html = render_live(doc)
    return html[html.index("<h2>Batches") :]


def test_integrity_events_name_the_batch_range_and_replay() -> None:
    infos = batches(_log())
    history = {
        1: {"violations_by_partition": {"site-a[0]": {"seq_gap": 2, "undecodable": 1}}},
        2: {"violations_by_partition": {"site-a[1]": {"seq_gap": 1}, "bad name": {"x": 1}}},
    }
    events = integrity_events("p.toml", infos, history)
    assert [(e.batch_id, e.topic, e.partition, e.rule, e.count) for e in events] == [
        (2, "site-a", 1, "seq_gap", 1),
        (1, "site-a", 0, "seq_gap", 2),
        (1, "site-a", 0, "undecodable", 1),
    ]
    # Batch 2 read nothing from A1 (an event such as a timeout): the replay starts where
    # the partition stood.
    assert (events[0].first_offset, events[0].last_offset) == (90, None)
    assert events[0].replay.endswith("--from-offset 90 --break-on-violation")
    assert (events[1].first_offset, events[1].last_offset) == (100, 299)
    assert "--from-offset 100 --to-offset 299 --break-on-violation" in events[1].replay
    assert events_by_partition(events) == {A1: 1, A0: 3}


def _progress(batch_id: int) -> BatchProgress:
    return BatchProgress(batch_id, 10, 5.0, 2.0, 0, 3, 10, 1, {"seq_gap": 1})


def test_history_file_is_kept_and_bounded(tmp_path: Path) -> None:
    history = BatchHistory(CheckpointLayout.of(tmp_path), max_bytes=2000)
    for batch_id in range(20):
        history.on_batch(_progress(batch_id), {"site-a[0]": batch_id})
    path = tmp_path / HISTORY_FILE
    assert path.stat().st_size <= 2000
    assert (tmp_path / (HISTORY_FILE + ".1")).stat().st_size <= 2000
    found = read_history(CheckpointLayout.of(tmp_path))
    assert max(found) == 19 and len(found) < 20  # the oldest lines were dropped
    assert found[19]["lag_by_partition"] == {"site-a[0]": 19}
    assert found[19]["seconds"] == {} and found[19]["violations"] == {"seq_gap": 1}
    # A line cut short by a crash is skipped; a batch recorded again keeps its newest line.
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"batch_id": 19, "records": 99}\n{"batch_id": 20, "rec')
    assert read_history(CheckpointLayout.of(tmp_path))[19]["records"] == 99
    assert 20 not in read_history(CheckpointLayout.of(tmp_path))
    assert json.loads(path.read_text().splitlines()[0])["batch_id"] > 0
    # In memory too (an object-store checkpoint keeps no file).
    assert [line["batch_id"] for line in history.recent][-1] == 19
    # In memory only the newest line keeps its lag per partition (the one the page reads);
    # the file keeps every line's.
    lags = [line["lag_by_partition"] for line in history.recent]
    assert lags == [None] * 19 + [{"site-a[0]": 19}]
    assert found[18]["lag_by_partition"] == {"site-a[0]": 18}


def test_rendered_values_are_escaped() -> None:
    evil = "<script>alert(1)</script>"
    doc = {
        "checkpoint": evil,
        "broker": evil,
        "running": None,
        "last_committed_batch": None,
        "batches_in_log": 0,
        "partitions": [
            {
                "topic": evil, "partition": 0, "committed": 1, "end_offset": None, "lag": None,
                "records_per_second": None, "last_batch_at": None, "state_keys": None,
                "state_bytes": None, "events": 0, "resets": 0, "ignored": 0,
            }
        ],
        "batches": [],
        "events": [],
        "resets": [],
        "history_recorded": False,
        "state": [],
        "output": {"kind": evil, "location": evil, "files": None, "rows": None, "bytes": None},
    }  # fmt: skip
    html = render_live(doc)
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_records_ignored_after_resets_are_shown_with_the_first_reset() -> None:
    part = {
        "topic": "site-a", "partition": 1, "committed": 90, "end_offset": 90, "lag": 0,
        "records_per_second": None, "last_batch_at": None, "state_keys": None,
        "state_bytes": None, "events": 2, "resets": 2, "ignored": 57,
    }  # fmt: skip
    resets = [
        {"kind": "reset", "rule": "session reset", "topic": "site-a", "partition": 1,
         "batch_id": b, "first_offset": o, "last_offset": o, "count": 1, "replay": "", "key": "S"}
        for b, o in ((3, 71), (1, 12))
    ]  # fmt: skip
    doc = {
        "checkpoint": "c", "broker": "reachable", "running": None, "last_committed_batch": 3,
        "batches_in_log": 4, "partitions": [part], "batches": [], "events": [],
        "resets": resets, "history_recorded": True, "state": [],
        "output": {"kind": "parquet", "location": "o", "files": 1, "rows": 1, "bytes": 1},
    }  # fmt: skip
    html = render_live(doc)
    assert "57 later records of reset sessions ignored since offset 12" in html
    assert 'data-field="ignored">57<' in html
