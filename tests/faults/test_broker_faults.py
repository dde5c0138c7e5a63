"""Fault matrix, broker faults: the broker goes away, a topic goes away or grows, records expire.

Each case starts a broker of its own (``own_broker``: fresh data directory, free port, stopped
by pid), so stopping it touches nobody else, and topic names are fixed (records land in the
same partitions on every run). A case either survives exactly (checked against the
simulator's ground truth and ``inorder validate``, as the process faults are) or ends with
the named data-loss error, whose exact line is computed from the checkpoint's offsets log;
a run with ``source.fail_on_data_loss = false`` then goes on past the loss.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from confluent_kafka.cimpl import TopicPartition as KafkaTopicPartition

from inorder.assemble import load_target
from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.names import SOURCE_HIGHS_FILE
from inorder.commands.run import dump_toml
from inorder.kafka.high_marks import load_high_marks
from inorder.kafka.offsets import SourceOffset
from inorder.kafka.options import DEFAULT_METADATA_TIMEOUT_MS
from inorder.kafka.planning import LossEvent, LossKind
from inorder.ops.validate import validate
from inorder.pipeline.config import validate as validate_config
from inorder.records import TopicPartition
from inorder.sessions.rebuild import read_changes
from tests.faults.conftest import MatrixRecorder
from tests.faults.test_process_faults import (
    RUN_TIMEOUT,
    DriverRun,
    Job,
    OwnBroker,
    exact_check,
    finish,
    make_job,
    own_broker,
    verified,
    wait_for_marker,
    wait_until,
)
from tests.fixtures.sessions_job import duplicate_change_rows

__all__ = ["own_broker"]  # the fixture, used by name below

#: The longest the broker stays down: longer than the window in which a run waits for it (the
#: job's default ``inorder.metadataTimeoutMs``, 10 s, after which the planner names it).
OUTAGE = 30.0
METADATA_TIMEOUT_S = DEFAULT_METADATA_TIMEOUT_MS / 1000
SKIP_LOSS = ("--set", "source.fail_on_data_loss=false")


def offsets_log(checkpoint: Path) -> dict[int, SourceOffset]:
    """Spark's offsets log of the checkpoint: the end offset of every planned batch."""
    found = {}
    for path in (checkpoint / "spark" / "offsets").glob("[0-9]*"):
        found[int(path.name)] = SourceOffset.from_json(path.read_text().splitlines()[2])
    return found


def error_line(job: Job, message: str) -> str:
    log = CheckpointLayout.of(str(job.toml.parent / "checkpoint")).run_log_file("faults")
    return f"inorder: error: {message} (full trace in {log})"


def only_topic(job: Job, topic: str) -> Job:
    """The same job with the truth of ``topic``'s sessions only."""
    truth = job.truth
    sessions = {k: s for k, s in truth.sessions.items() if s.topic == topic}
    topics = {k: t for k, t in truth.topics.items() if k == topic}
    narrowed = dataclasses.replace(truth, sessions=sessions, topics=topics)
    return dataclasses.replace(job, truth=narrowed)


def test_broker_down_30_s_mid_batch(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    # Three batches: the outage meets batch 1's held task, batch 2 is read after it.
    job = make_job(own_broker.bootstrap_servers, tmp_path, prefix="bd-", seed=21, messages=1500)
    job.arm()
    run = DriverRun(job.toml)
    wait_for_marker(job, run)
    own_broker.stop()
    job.disarm()
    # The broker comes back when the run has given up (it waited past its metadata timeout
    # and stopped) or after OUTAGE, whichever is first: once the run has stopped, the rest of
    # the outage changes nothing the next run sees, so waiting it out only costs time.
    deadline = time.monotonic() + OUTAGE
    while run.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    own_broker.start()  # the same port and data directory
    rc = run.wait()
    named = True
    if rc == 0:
        outcome, what = "continued", "the run waited for the broker and finished"
    else:
        outcome = "named error"
        line = run.error_line()
        # The planner met the outage: the line names the broker, not a trace, and the exit
        # code is a failure's (1), not a wrong setting's (2): the broker answered at start.
        named = rc == 1 and "no broker answered" in line and "Traceback" not in line
        what = f"the run ended with exit {rc}, {line!r}; the next run resumed"
        finish(job.toml)
    ok, check = exact_check(job)
    matrix.record(
        group="broker",
        fault=f"broker stopped mid-batch past the {METADATA_TIMEOUT_S:.0f} s metadata timeout "
        f"(until the run stopped, at most {OUTAGE:.0f} s), restarted on its port",
        times=1, outcome=outcome, check=f"{what}; {check}", ok=ok and named,
    )  # fmt: skip
    assert ok, check
    assert named, what


def finish_setting_aside(toml: Path, *flags: str) -> dict[str, Any]:
    """Run to the end under a policy that sets data aside: exit 3 (the default, which the
    job turns off for its other runs), and the summary event."""
    run = DriverRun(
        toml, "--trigger", "available-now", "--set", "pipeline.set_aside_exit_code=3", *flags
    )
    rc = run.wait()
    assert rc == 3, f"exit {rc}, not 3: {run.events[-1:]}" + "".join(run.stderr)[-3000:]
    return next(e for e in run.events if e.get("event") == "summary")


def test_topic_deleted_while_read(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    job = make_job(own_broker.bootstrap_servers, tmp_path, prefix="dt-", seed=22)
    deleted, kept = "dt-001", "dt-000"
    job.arm()
    run = DriverRun(job.toml)
    wait_for_marker(job, run)
    admin = AdminClient({"bootstrap.servers": own_broker.bootstrap_servers})
    admin.delete_topics([deleted])[deleted].result(30)
    job.disarm()
    rc = run.wait()
    line = run.error_line()
    stopped_ok, stopped_proof = verified(job.toml)  # what the stopped run committed
    # The task reading it (offsets start..end of the batch) or the planner of the next batch
    # (offsets end..the last end it saw) names the loss, for the first partition with unread
    # records.
    log = offsets_log(tmp_path / "checkpoint")
    last = max(log)
    candidates = []
    for partition in (0, 1):
        tp = TopicPartition(deleted, partition)
        start = log[last - 1].positions[tp] if last else 0
        end = log[last].positions[tp]
        high = job.truth.topics[deleted].end_offsets[partition]
        for a, b in ((start, end), (end, high), (start, high)):
            if b > a:
                candidates.append(error_line(job, LossEvent(tp, LossKind.DELETED, a, b).message()))
    named = rc == 1 and line in candidates
    # The restarted run re-runs the batch the failed one planned (if it planned one): its
    # tasks find the topic gone and count that batch's unread range as lost. Beyond it, the
    # planner counts up to the ends the failed run saw while a backlog remained (kept beside
    # the checkpoint), and drops both partitions from the plan (docs/kafka-source.md, "Known
    # limits of loss accounting").
    commits = tmp_path / "checkpoint" / "spark" / "commits"
    done = max((int(p.name) for p in commits.glob("[0-9]*")), default=None)
    seen = load_high_marks(str(tmp_path / "checkpoint" / SOURCE_HIGHS_FILE))
    # Produced before the run, read in capped batches: the failed run saw every end.
    ends = job.truth.topics[deleted].end_offsets
    assert {p: seen.get(TopicPartition(deleted, p)) for p in (0, 1)} == {
        p: ends[p] for p in (0, 1)
    }, seen
    unread = 0
    for partition in (0, 1):
        tp = TopicPartition(deleted, partition)
        read_to = log[done].positions.get(tp, 0) if done is not None else 0
        planned = log[last].positions.get(tp, 0)
        unread += max(0, planned - read_to) + max(0, seen.get(tp, 0) - planned)
    summary = (
        finish_setting_aside(job.toml, *SKIP_LOSS)
        if unread
        else next(e for e in finish(job.toml, *SKIP_LOSS).events if e["event"] == "summary")
    )
    ok, check = exact_check(
        only_topic(job, kept),
        lambda rows: pc.equal(rows.column("topic"), kept),
        only=lambda tp: tp.topic == kept,
    )
    duplicated = duplicate_change_rows(read_changes(str(job.output)))
    matrix.record(
        group="broker", fault="topic deleted while being read (strict, fail_on_data_loss)",
        times=1, outcome="named error", check=f"exit {rc}: {line!r}; {stopped_proof}",
        ok=named and stopped_ok,
    )  # fmt: skip
    matrix.record(
        group="broker", fault="topic deleted while being read (fail_on_data_loss = false)",
        times=1, outcome="policy action",
        check=f"{summary['pruned_partitions']} partitions dropped from the plan, "
        f"{summary['skipped_lost']} unread offsets counted lost, the re-run batch's and "
        f"on to the ends the failed run saw (expected "
        f"{unread}, exit 3 if any); the other topic: {check}; "
        f"{duplicated} duplicated rows of the deleted one",
        ok=ok
        and duplicated == 0
        and summary["pruned_partitions"] == 2
        and summary["skipped_lost"] == unread,
    )  # fmt: skip
    assert named, f"{line!r} is not one of {candidates}"
    assert stopped_ok, stopped_proof
    assert ok and duplicated == 0, check
    assert summary["pruned_partitions"] == 2 and summary["skipped_lost"] == unread, (
        summary,
        unread,
    )


def _produce(bootstrap: str, topic: str, partitions: list[int], count: int, first: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(first, first + count):
        part = partitions[i % len(partitions)]
        producer.produce(topic, key=f"k{i % 7}", value=str(i).encode(), partition=part)
    assert producer.flush(30) == 0


def _committed_rows(output: Path) -> pa.Table | None:
    if not (output / "_inorder" / "commits").is_dir():
        return None
    return read_changes(str(output))


def test_partition_added_mid_run(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    bootstrap, topic = own_broker.bootstrap_servers, "grow"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(30)
    _produce(bootstrap, topic, [0, 1], 2000, 0)
    config = validate_config(
        {
            "pipeline": {"name": "faults", "checkpoint": str(tmp_path / "checkpoint"),
                         "trigger": "1 second", "progress": "json"},
            "source": {"bootstrap_servers": bootstrap, "topics": [topic],
                       "max_offsets_per_trigger": 400, "topic_discovery_interval": "1 second"},
            "codec": {"type": "raw"},
            "processor": {"type": "tests.e2e.cli_jobs:CountRaw"},
            "sink": {"path": str(tmp_path / "output")},
            "spark": {"master": "local[2]"},
        }
    )  # fmt: skip
    toml = tmp_path / "pipeline.toml"
    toml.write_text(dump_toml(config))
    output = tmp_path / "output"
    run = DriverRun(toml)
    try:
        wait_until(lambda: _committed_rows(output) is not None, run, "a commit", RUN_TIMEOUT)
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
        _produce(bootstrap, topic, [0, 1, 2], 900, 2000)
        total = 2900

        def all_rows() -> bool:
            rows = _committed_rows(output)
            return rows is not None and rows.num_rows >= total

        wait_until(all_rows, run, f"{total} committed rows", RUN_TIMEOUT)
        run.signal(signal.SIGTERM)
    finally:
        rc = run.wait()
    rows = read_changes(str(output))
    found: dict[int, list[tuple[int, int]]] = {}
    for p, o, n in zip(
        *(rows.column(c).to_pylist() for c in ("partition", "offset", "n")), strict=True
    ):
        found.setdefault(p, []).append((o, n))
    sizes = {0: 1300, 1: 1300, 2: 300}
    exact = {
        p: sorted(found.get(p, [])) == [(o, o + 1) for o in range(size)]
        for p, size in sizes.items()
    }
    report = validate(load_target(str(toml)))
    proof_ok, proof = verified(toml)
    ok = rc == 0 and all(exact.values()) and report.ok and proof_ok
    check = (
        f"{'exact' if ok else 'NOT exact'}: every offset of partitions 0-2 once, counted in "
        f"offset order ({rows.num_rows} rows; new partition read from offset 0); "
        f"validate {'clean' if report.ok else 'NOT clean'}; {proof}; stopped with exit {rc}"
    )
    matrix.record(
        group="broker", fault="partition added to a topic mid-run", times=1,
        outcome="continued", check=check, ok=ok,
    )  # fmt: skip
    assert ok, (check, exact, "\n".join(report.lines()))


def test_records_expire_before_read(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    job = make_job(own_broker.bootstrap_servers, tmp_path, prefix="ex-", seed=23)
    first = DriverRun(job.toml, "--stop-after-batches", "1")
    assert first.wait() == 0, "".join(first.stderr)[-2000:]
    tp = TopicPartition("ex-000", 0)
    position = offsets_log(tmp_path / "checkpoint")[0].positions[tp]
    expired = position + 100
    admin = AdminClient({"bootstrap.servers": own_broker.bootstrap_servers})
    for future in admin.delete_records([KafkaTopicPartition(tp.topic, 0, expired)]).values():
        future.result(30)
    lost = DriverRun(job.toml)
    rc = lost.wait()
    line = lost.error_line()
    stopped_ok, stopped_proof = verified(job.toml)  # what the stopped run committed
    expected = error_line(job, LossEvent(tp, LossKind.EXPIRED, position, expired).message())
    summary = finish_setting_aside(job.toml, *SKIP_LOSS)
    changes = read_changes(str(job.output))
    offsets = set(changes.filter(_at(changes, tp)).column("offset").to_pylist())
    gap_clean = not offsets & set(range(position, expired))
    rest = dataclasses.replace(
        job,
        truth=dataclasses.replace(
            job.truth,
            sessions={
                k: s
                for k, s in job.truth.sessions.items()
                if (s.topic, s.partition) != (tp.topic, 0)
            },
        ),
    )
    ok, check = exact_check(rest, lambda rows: pc.invert(_at(rows, tp)), only=lambda o: o != tp)
    matrix.record(
        group="broker", fault="records expired (delete_records) before read (strict)",
        times=1, outcome="named error", check=f"exit {rc}: {line!r}; {stopped_proof}",
        ok=rc == 1 and line == expected and stopped_ok,
    )  # fmt: skip
    matrix.record(
        group="broker", fault="records expired before read (fail_on_data_loss = false)",
        times=1, outcome="policy action",
        check=f"offsets {position}..{expired - 1} skipped (none in the output); exit 3, "
        f"summary {json.dumps({k: summary.get(k) for k in ('records', 'skipped_lost')})}; "
        f"other partitions: {check}",
        ok=ok and gap_clean and summary["skipped_lost"] == expired - position,
    )  # fmt: skip
    assert rc == 1 and line == expected, (line, expected)
    assert stopped_ok, stopped_proof
    assert ok and gap_clean, check
    assert summary["skipped_lost"] == expired - position, summary
    assert summary["set_aside_text"].startswith(
        "set aside: 100 offset(s) no longer in Kafka skipped, never read"
    ), summary


def _at(changes: pa.Table, tp: TopicPartition) -> Any:
    return pc.and_(
        pc.equal(changes.column("topic"), tp.topic),
        pc.equal(changes.column("partition"), tp.partition),
    )
