"""Produce a simulation to a Kafka broker and write its ground truth.

:func:`simulate` creates the site topics, produces the records of
:class:`~inorder.dev.sim_model.SiteModel` in order, learns from delivery reports where the
records that matter landed (each session's partition, the offset of every violating record),
and returns (and optionally writes) a :class:`~inorder.dev.ground_truth.GroundTruth`. The
ground truth's classes, :func:`load_ground_truth` and the settings classes are importable from
here too; they live in :mod:`inorder.dev.ground_truth` and :mod:`inorder.dev.sim_config`.

Pitfalls this module handles:

* The idempotent producer is used so that retries cannot reorder a session's records: the
  ground truth depends on records landing in the order they were produced.
* Delivery reports for untracked records only count errors; a run with any failed delivery
  raises instead of writing a ground truth that does not match the topic.
* librdkafka logs connection failures itself; its log goes to the ``inorder.kafka`` logger so a
  command shows one clear error instead of a stream of retries.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inorder.dev.ground_truth import (
    FaultTruth,
    GroundTruth,
    SessionTruth,
    TopicTruth,
    build_ground_truth,
    load_ground_truth,
    write_ground_truth,
)
from inorder.dev.sim_config import FaultKind, FaultRates, OpMix, SimulationConfig
from inorder.dev.sim_model import SiteModel
from inorder.errors import ConfigError, InorderError
from inorder.kafka.logs import KAFKA_LOG

__all__ = [
    "FaultKind",
    "FaultRates",
    "FaultTruth",
    "GroundTruth",
    "OpMix",
    "SessionTruth",
    "SimulationConfig",
    "SimulationResult",
    "TopicTruth",
    "load_ground_truth",
    "simulate",
    "write_ground_truth",
]

#: Seconds to wait for the broker to answer before calling it unreachable.
CONNECT_TIMEOUT_S = 5.0
#: Bound of each end-offset query once the broker has answered (a reachable broker on a busy
#: machine can take longer than the first contact allows; the query returns when it answers).
WATERMARK_TIMEOUT_S = 60.0

_kafka_log = KAFKA_LOG

_POLL_EVERY = 2048  # records between producer polls / clock checks


@dataclass(frozen=True)
class SimulationResult:
    """Outcome of :func:`simulate`: the ground truth and the measured produce rate."""

    ground_truth: GroundTruth
    ground_truth_path: Path | None
    messages: int
    records: int
    elapsed_s: float
    records_per_s: float
    topics: list[str] = field(default_factory=list)
    interrupted: bool = False

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (what ``inorder simulate --json`` prints)."""
        truth = self.ground_truth
        faults: dict[str, int] = {}
        for fault in truth.faults():
            faults[fault.kind.value] = faults.get(fault.kind.value, 0) + 1
        return {
            "topics": self.topics,
            "messages": self.messages,
            "records": self.records,
            "records_by_topic": {name: t.records for name, t in truth.topics.items()},
            "sessions": len(truth.sessions),
            "sessions_ended": sum(s.ended for s in truth.sessions.values()),
            "sessions_with_faults": sum(bool(s.faults) for s in truth.sessions.values()),
            "sessions_table_unknown": sum(not s.table_exact for s in truth.sessions.values()),
            "faults": faults,
            "late_activated_at": truth.late_activated_at,
            "elapsed_s": round(self.elapsed_s, 3),
            "records_per_s": round(self.records_per_s, 1),
            "ground_truth": str(self.ground_truth_path) if self.ground_truth_path else None,
            "interrupted": self.interrupted,
        }


def producer_config(bootstrap_servers: str) -> dict[str, Any]:
    """librdkafka settings tuned for throughput while keeping per-partition order."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        # Same key -> partition mapping as the Java client's default partitioner.
        "partitioner": "murmur2_random",
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "message.timeout.ms": 60_000,
        "socket.connection.setup.timeout.ms": int(CONNECT_TIMEOUT_S * 1000),
        "logger": _kafka_log,
    }


def _admin(bootstrap_servers: str) -> Any:
    from confluent_kafka.admin import AdminClient

    settings: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": _kafka_log}
    return AdminClient(settings)


def _check_reachable(admin: Any, bootstrap_servers: str) -> None:
    from confluent_kafka import KafkaException

    try:
        admin.list_topics(timeout=CONNECT_TIMEOUT_S)
    except KafkaException as exc:
        raise ConfigError(
            f"cannot reach Kafka at {bootstrap_servers} within {CONNECT_TIMEOUT_S:.0f} s: "
            f"{exc.args[0].str() if exc.args else exc}"
        ) from None


def ensure_topics(admin: Any, topics: list[str], partitions: int) -> dict[str, int]:
    """Create missing ``topics`` with ``partitions`` partitions; partition count of each."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.cimpl import NewTopic

    existing = admin.list_topics(timeout=CONNECT_TIMEOUT_S).topics
    missing = [t for t in topics if t not in existing]
    if missing:
        futures = admin.create_topics(
            [NewTopic(t, num_partitions=partitions, replication_factor=-1) for t in missing],
            operation_timeout=10,
        )
        for topic, future in futures.items():
            try:
                future.result(timeout=15)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise InorderError(
                        f"cannot create topic {topic}: {exc.args[0].str()}"
                    ) from None
    counts: dict[str, int] = {}
    deadline = time.monotonic() + 15
    for topic in topics:
        while True:
            meta = admin.list_topics(topic=topic, timeout=CONNECT_TIMEOUT_S).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                counts[topic] = len(meta.partitions)
                break
            if time.monotonic() > deadline:
                raise InorderError(f"topic {topic} did not appear in the broker's metadata")
            time.sleep(0.05)
    return counts


class _GracefulInterrupt:
    """SIGINT during a run stops generating; what was generated is still flushed and recorded.

    A handler (not ``except KeyboardInterrupt``) so the model is never interrupted halfway
    through a message, which would leave the ground truth inconsistent with the records.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # Second Ctrl-C: give up at once.
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


class _Deliveries:
    """Delivery-report sink: positions of tracked records, errors of all."""

    def __init__(self) -> None:
        self.positions: dict[int, tuple[int, int]] = {}
        self.errors = 0
        self.first_error: str | None = None

    def untracked(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._error(err, msg)

    def tracked(self, index: int) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                self._error(err, msg)
            else:
                self.positions[index] = (msg.partition(), msg.offset())

        return report

    def _error(self, err: Any, msg: Any) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"topic {msg.topic()} partition {msg.partition()}: {err.str()}"


def simulate(
    config: SimulationConfig,
    bootstrap_servers: str,
    ground_truth_path: str | os.PathLike[str] | None = None,
    progress: Callable[[int, float], None] | None = None,
    encode: Callable[[str, bytes], bytes] | None = None,
) -> SimulationResult:
    """Run the simulation against ``bootstrap_servers``; return (and write) the ground truth.

    ``progress(records, elapsed_s)`` is called about once a second. ``encode(topic, value)``
    re-encodes each JSON value before it is produced (a registry format:
    :func:`inorder.dev.sim_formats.framed_encoder`). Raises
    :class:`~inorder.errors.ConfigError` for invalid settings or an unreachable broker, and
    :class:`~inorder.errors.InorderError` if any record could not be delivered.
    """
    from confluent_kafka import Producer

    config.validate()
    admin = _admin(bootstrap_servers)
    _check_reachable(admin, bootstrap_servers)
    partitions = ensure_topics(admin, config.initial_topics(), config.partitions)
    late = set(config.late_topics())
    model = SiteModel(config)
    deliveries = _Deliveries()
    producer = Producer(producer_config(bootstrap_servers))
    produce = producer.produce
    untracked = deliveries.untracked
    deadline = None if config.duration is None else time.monotonic() + config.duration
    late_deadline = None
    if late and config.messages is None and config.duration is not None:
        late_deadline = time.monotonic() + config.late_after * config.duration
    rate = config.rate
    started = time.monotonic()
    last_progress = started
    records = model.records()
    count = 0
    stopping = False
    interrupt = _GracefulInterrupt()
    # Clock checks (rate pacing, duration, progress) every few records keep the hot loop lean.
    check_every = _POLL_EVERY if rate == 0 else max(1, min(_POLL_EVERY, int(rate // 50)))
    try:
        while True:
            rec = next(records, None)
            if rec is None:
                break
            if rec.topic not in partitions:
                partitions.update(ensure_topics(admin, [rec.topic], config.partitions))
            callback = deliveries.tracked(rec.index) if rec.track else untracked
            value = rec.value if encode is None else encode(rec.topic, rec.value)
            while True:
                try:
                    produce(rec.topic, value, rec.key, on_delivery=callback)
                    break
                except BufferError:  # Local queue full: let librdkafka drain it.
                    producer.poll(0.05)
            count += 1
            if count % check_every:
                continue
            producer.poll(0)
            if deliveries.errors:  # A dead broker would otherwise fill the queue until timeouts.
                raise InorderError(f"delivery failed: {deliveries.first_error}")
            now = time.monotonic()
            if rate > 0:
                ahead = started + count / rate - now
                if ahead > 0:
                    time.sleep(ahead)
                    now = time.monotonic()
            if progress is not None and now - last_progress >= 1.0:
                progress(count, now - started)
                last_progress = now
            if late_deadline is not None and now >= late_deadline:
                model.activate_late_sites()
                late_deadline = None
            if not stopping and (interrupt.requested or (deadline is not None and now >= deadline)):
                stopping = True
                records = iter(model.drain())
    finally:
        interrupt.restore()
    remaining = producer.flush(60)
    elapsed = time.monotonic() - started
    if remaining:
        raise InorderError(f"{remaining} records still undelivered after 60 s")
    if deliveries.errors:
        raise InorderError(
            f"{deliveries.errors} records failed delivery; first: {deliveries.first_error}"
        )
    end_offsets = _end_offsets(bootstrap_servers, partitions)
    truth = build_ground_truth(config, model, deliveries.positions, partitions, end_offsets)
    path = None
    if ground_truth_path is not None:
        path = Path(ground_truth_path)
        write_ground_truth(truth, path)
    return SimulationResult(
        ground_truth=truth,
        ground_truth_path=path,
        messages=model.messages,
        records=count,
        elapsed_s=elapsed,
        records_per_s=count / elapsed if elapsed > 0 else math.inf,
        topics=sorted(partitions),
        interrupted=interrupt.requested,
    )


def _end_offsets(
    bootstrap_servers: str, partitions: Mapping[str, int]
) -> dict[str, dict[int, int]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "inorder-simulate-watermarks",
            "enable.auto.commit": False,
            "logger": _kafka_log,
        }
    )
    try:
        out: dict[str, dict[int, int]] = {}
        for topic, count in partitions.items():
            out[topic] = {
                p: consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=WATERMARK_TIMEOUT_S
                )[1]
                for p in range(count)
            }
        return out
    finally:
        consumer.close()
