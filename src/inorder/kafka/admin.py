"""Kafka metadata for planning: topics, partitions, watermarks, offsets for times.

Every call has a bounded timeout; an unreachable broker becomes a one-line
:class:`~inorder.errors.ConfigError` naming the bootstrap servers (never the credentials).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from inorder.errors import ConfigError
from inorder.kafka.logs import KAFKA_LOG
from inorder.kafka.options import SourceOptions
from inorder.kafka.planning import Watermarks
from inorder.records import TopicPartition

#: Topics the broker uses internally; a pattern never matches them.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


def client_config(options: SourceOptions) -> dict[str, str]:
    """librdkafka settings shared by the admin client and the consumers."""
    conf = {"bootstrap.servers": options.bootstrap_servers}
    for key, value in options.kafka.items():
        if key in ("isolation.level", "group.id"):
            continue  # consumer-only; the admin client would warn about them
        conf[key] = value
    return conf


class BrokerUnreachable(ConfigError):
    """No broker answered within the metadata timeout."""


class KafkaAdmin:
    """Metadata calls the driver needs for planning (thin wrapper over ``AdminClient``)."""

    def __init__(self, options: SourceOptions) -> None:
        from confluent_kafka.admin import AdminClient

        self._options = options
        self._timeout = options.metadata_timeout_ms / 1000.0
        #: Topics the last metadata answer listed with an error (e.g. no leader right now).
        #: They exist: the planner neither prunes them nor starts them as new.
        self.errored_topics: frozenset[str] = frozenset()
        conf: dict[str, Any] = client_config(options)
        conf.setdefault("socket.connection.setup.timeout.ms", str(options.metadata_timeout_ms))
        conf.setdefault("logger", KAFKA_LOG)
        try:
            self._admin = AdminClient(conf)
        except Exception as exc:  # invalid librdkafka property or value
            raise ConfigError(f"kafka.*: {_kafka_message(exc)}") from None

    def _unreachable(self, exc: BaseException) -> ConfigError:
        return BrokerUnreachable(
            f"kafka.bootstrap.servers={self._options.bootstrap_servers}: no broker answered "
            f"within {self._timeout:g} s ({_kafka_message(exc)})"
        )

    def topic_partitions(self) -> dict[str, int]:
        """Every non-internal topic and its partition count."""
        try:
            metadata = self._admin.list_topics(timeout=self._timeout)
        except Exception as exc:
            raise self._unreachable(exc) from None
        topics: dict[str, int] = {}
        errored: set[str] = set()
        for name, meta in metadata.topics.items():
            if name in INTERNAL_TOPICS:
                continue
            if meta.error is not None:
                # A deleted topic is absent from the answer; one listed with an error exists
                # and is passing through a transient state (leader election, creation).
                errored.add(name)
                continue
            topics[name] = len(meta.partitions)
        self.errored_topics = frozenset(errored)
        return topics

    def discover(self) -> list[TopicPartition]:
        """The topic-partitions the subscription covers right now, sorted.

        Raises :class:`ConfigError` for a ``subscribe`` topic or ``assign`` partition the
        broker does not know, naming the option.
        """
        topics = self.topic_partitions()
        opts = self._options
        if opts.subscribe_pattern is not None:
            pattern = re.compile(opts.subscribe_pattern)
            chosen = {t: n for t, n in topics.items() if pattern.fullmatch(t)}
            return sorted(TopicPartition(t, p) for t, n in chosen.items() for p in range(n))
        if opts.subscribe:
            return sorted(
                TopicPartition(t, p)
                for t in opts.subscribe
                if t in topics
                for p in range(topics[t])
            )
        return sorted(tp for tp in opts.assign if tp.partition < topics.get(tp.topic, 0))

    def unsettled_topics(self) -> list[str]:
        """Topics the subscription covers that the last metadata answer listed with an error
        (no leader yet, being created): they exist, but their partitions are unknown."""
        opts = self._options
        pattern = opts.pattern
        assigned = {tp.topic for tp in opts.assign}
        return sorted(
            t
            for t in self.errored_topics
            if (
                pattern.fullmatch(t)
                if pattern is not None
                else t in opts.subscribe or t in assigned
            )
        )

    def topic_names(self) -> list[str]:
        """Every non-internal topic the broker lists right now (errored ones too), sorted."""
        return sorted(set(self.topic_partitions()) | self.errored_topics)

    def matching_topics(self) -> list[str]:
        """The topics ``subscribePattern`` matches right now, sorted (none without a pattern)."""
        pattern = self._options.pattern
        if pattern is None:
            return []
        return [t for t in self.topic_names() if pattern.fullmatch(t)]

    def check_subscription(self) -> None:
        """Fail with a message naming the option if a listed topic or partition is unknown."""
        topics = self.topic_partitions()
        opts = self._options
        missing = [t for t in opts.subscribe if t not in topics]
        if missing:
            raise ConfigError(
                f"subscribe: unknown topic(s) {', '.join(missing)} on "
                f"{opts.bootstrap_servers} (create them first, or use topic_pattern / "
                "subscribePattern, which picks topics up as they appear)"
            )
        bad = [str(tp) for tp in opts.assign if tp.partition >= topics.get(tp.topic, 0)]
        if bad:
            raise ConfigError(f"assign: unknown topic-partition(s) {', '.join(bad)}")

    def watermarks(
        self, tps: Iterable[TopicPartition]
    ) -> tuple[dict[TopicPartition, Watermarks], set[TopicPartition]]:
        """Log-start and end offsets (LSO under read_committed); plus partitions that failed."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka import TopicPartition as CTP

        wanted = sorted(set(tps))
        if not wanted:
            return {}, set()
        level = (
            IsolationLevel.READ_COMMITTED
            if self._options.isolation_level == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        lows = self._list_offsets(
            {CTP(tp.topic, tp.partition): _spec("earliest") for tp in wanted}, level
        )
        highs = self._list_offsets(
            {CTP(tp.topic, tp.partition): _spec("latest") for tp in wanted}, level
        )
        result: dict[TopicPartition, Watermarks] = {}
        failed: set[TopicPartition] = set()
        for tp in wanted:
            low, high = lows.get(tp), highs.get(tp)
            # An answer without an error but no offset (-1) is no end to plan to: a target
            # of -1 would mean "nothing to read" for a partition that has records.
            if low is None or high is None or low < 0 or high < low:
                failed.add(tp)
            else:
                result[tp] = Watermarks(low, high)
        return result, failed

    def offsets_for_times(
        self, times: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        """First offset with timestamp >= the given ms per partition (None: no such record)."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka import TopicPartition as CTP

        if not times:
            return {}
        found = self._list_offsets(
            {CTP(tp.topic, tp.partition): _spec("for_timestamp", ms) for tp, ms in times.items()},
            IsolationLevel.READ_COMMITTED,
        )
        return {tp: (found.get(tp) if (found.get(tp) or -1) >= 0 else None) for tp in times}

    def _list_offsets(self, request: dict[Any, Any], level: Any) -> dict[TopicPartition, int]:
        try:
            futures = self._admin.list_offsets(
                request, isolation_level=level, request_timeout=self._timeout
            )
        except Exception as exc:
            raise self._unreachable(exc) from None
        out: dict[TopicPartition, int] = {}
        for ctp, future in futures.items():
            try:
                info = future.result(timeout=self._timeout + 5)
            except Exception as exc:
                code = _error_code(exc)
                if code in _TRANSPORT_CODES:
                    raise self._unreachable(exc) from None
                continue  # unknown topic-partition (deleted): reported as failed
            out[TopicPartition(ctp.topic, ctp.partition)] = int(info.offset)
        return out


def _spec(kind: str, *args: int) -> Any:
    """An ``OffsetSpec`` (not exported in confluent-kafka's type stubs)."""
    import confluent_kafka.admin as admin_module

    return getattr(admin_module.OffsetSpec, kind)(*args)  # type: ignore[attr-defined]


_TRANSPORT_CODES = {"_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_RESOLVE"}


def _error_code(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "name"):
        return str(args[0].name())
    return ""


def _kafka_message(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "str"):
        return str(args[0].str())
    return str(exc) or type(exc).__name__
