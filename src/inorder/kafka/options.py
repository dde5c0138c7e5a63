"""Options of the ``inorder-kafka`` source: Spark Kafka connector names, parsed and checked.

Spark hands a data source its options in a case-insensitive map (``dict(options)`` has
lowercased keys), so every name here is matched case-insensitively. Unknown or conflicting
options fail fast with a :class:`~inorder.errors.ConfigError` naming the option; ``kafka.*``
options are passed to confluent-kafka (librdkafka) without the prefix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta

from inorder.durations import parse_duration
from inorder.errors import ConfigError
from inorder.kafka.offsets import EARLIEST, LATEST, parse_assign, parse_partition_offsets
from inorder.records import TopicPartition
from inorder.redaction import redact

#: Canonical option names (as documented), keyed by their lowercase form.
OPTION_NAMES = {
    name.lower(): name
    for name in (
        "kafka.bootstrap.servers",
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "startingOffsetsByTimestamp",
        "startingTimestamp",
        "maxOffsetsPerTrigger",
        "maxRecordsPerPartition",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "failOnDataLoss",
        "includeHeaders",
        "topicDiscoveryInterval",
        "newTopicStartingOffsets",
        "kafkaConsumer.pollTimeoutMs",
        "groupIdPrefix",
        "inorder.partitionMarkers",
        "inorder.rangesOnly",
        "inorder.rangeGroups",
        "inorder.targetBatchDuration",
        "inorder.tickIntervalMs",
        "inorder.batchRows",
        "inorder.metadataTimeoutMs",
        "inorder.highWatermarksFile",
        # Accepted for compatibility with Spark's connector; they have no effect here.
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "path",
    )
}

_UNSUPPORTED = {
    "minPartitions": "one task per topic-partition is what keeps records in offset order",
    "endingOffsets": "this is a streaming source; use Trigger.AvailableNow to stop at the end",
    "endingOffsetsByTimestamp": "this is a streaming source; use Trigger.AvailableNow",
    "kafka.auto.offset.reset": "use startingOffsets",
    "kafka.enable.auto.commit": "the source never commits consumer-group offsets",
    "kafka.key.deserializer": "keys are always returned as bytes",
    "kafka.value.deserializer": "values are always returned as bytes",
    "kafka.enable.partition.eof": "the source needs it to stop at the end of a range",
}
#: Spark connector options that cannot work here: lowercase name -> (name, reason).
UNSUPPORTED = {name.lower(): (name, reason) for name, reason in _UNSUPPORTED.items()}

DEFAULT_DISCOVERY_INTERVAL = timedelta(seconds=30)
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_METADATA_TIMEOUT_MS = 10_000
DEFAULT_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class SourceOptions:
    """Parsed, validated options of one source (picklable: sent to executors)."""

    bootstrap_servers: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: tuple[TopicPartition, ...] = ()
    starting_offsets: str = "latest"  # "earliest" | "latest" | "json"
    starting_positions: Mapping[TopicPartition, int] = field(default_factory=dict)
    starting_timestamps: Mapping[TopicPartition, int] = field(default_factory=dict)
    starting_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    max_records_per_partition: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: timedelta = timedelta(minutes=15)
    fail_on_data_loss: bool = True
    include_headers: bool = False
    topic_discovery_interval: timedelta = DEFAULT_DISCOVERY_INTERVAL
    new_topic_starting_offsets: str = "earliest"
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    metadata_timeout_ms: int = DEFAULT_METADATA_TIMEOUT_MS
    group_id_prefix: str = "inorder-kafka"
    partition_markers: bool = False
    ranges_only: bool = False
    #: With ``ranges_only``: pack a micro-batch's ranges into at most this many input
    #: partitions (0: one per range).
    range_groups: int = 0
    #: Size micro-batches to take about this long while a backlog lasts (see
    #: :mod:`inorder.kafka.batch_sizing`); ``maxOffsetsPerTrigger`` stays a hard cap.
    target_batch_duration: timedelta | None = None
    tick_interval_ms: int | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    #: Where the planner keeps the readable ends it saw while a backlog remained (see
    #: :mod:`inorder.kafka.high_marks`): a path or ``s3://`` URI, or ``None`` for nowhere.
    high_watermarks_file: str | None = None
    kafka: Mapping[str, str] = field(default_factory=dict)

    @property
    def subscription(self) -> str:
        """A human description of what is read (for messages)."""
        if self.subscribe_pattern is not None:
            return f"subscribePattern={self.subscribe_pattern!r}"
        if self.subscribe:
            return f"subscribe={','.join(self.subscribe)}"
        return "assign=" + ",".join(str(tp) for tp in self.assign)

    @property
    def pattern(self) -> re.Pattern[str] | None:
        """The compiled subscription pattern (full match, like Kafka's)."""
        return re.compile(self.subscribe_pattern) if self.subscribe_pattern is not None else None

    @property
    def isolation_level(self) -> str:
        """``read_committed`` unless overridden by ``kafka.isolation.level``."""
        return self.kafka.get("isolation.level", "read_committed")

    def redacted_kafka(self) -> dict[str, str]:
        """The passthrough settings with secrets replaced by ``***`` (safe to print)."""
        return redact(self.kafka)

    def __repr__(self) -> str:
        # The options travel to executors inside task specs; their repr must be safe to log.
        shown = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "kafka"
        )
        return f"SourceOptions({shown}, kafka={self.redacted_kafka()!r})"


def _bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _positive_int(name: str, value: str, *, minimum: int = 1) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if number < minimum:
        raise ConfigError(f"{name}: must be at least {minimum}, got {number}")
    return number


def _duration(name: str, value: str) -> timedelta:
    """A duration: plain number = milliseconds, or text with a unit ("30 seconds", "500ms")."""
    text = value.strip()
    if re.fullmatch(r"\d+", text):
        return timedelta(milliseconds=int(text))
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


_JAAS_PAIR = re.compile(r'(username|password)\s*=\s*"([^"]*)"')


def _kafka_passthrough(raw: Mapping[str, str]) -> dict[str, str]:
    """``kafka.*`` options minus the prefix; Java's ``sasl.jaas.config`` becomes librdkafka's."""
    conf: dict[str, str] = {}
    for key, value in raw.items():
        if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
            continue
        name = key[len("kafka.") :]
        if name == "sasl.jaas.config":
            # Ported Spark jobs carry the JVM login module line; librdkafka wants the pair.
            pairs = dict(_JAAS_PAIR.findall(value))
            if "username" not in pairs or "password" not in pairs:
                raise ConfigError(
                    'kafka.sasl.jaas.config: only username="..." password="..." login '
                    "modules are understood; set kafka.sasl.username and kafka.sasl.password"
                )
            conf["sasl.username"] = pairs["username"]
            conf["sasl.password"] = pairs["password"]
            continue
        conf[name] = value
    return conf


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate Spark-style options (any case) into :class:`SourceOptions`.

    Raises :class:`ConfigError` naming the option for unknown, conflicting or invalid ones.
    """
    raw: dict[str, str] = {}
    for key, value in options.items():
        lowered = key.lower()
        if lowered in raw:
            raise ConfigError(f"{key}: given twice (option names are case-insensitive)")
        raw[lowered] = str(value)
    for key in raw:
        if key in UNSUPPORTED:
            name, reason = UNSUPPORTED[key]
            raise ConfigError(f"{name}: not supported ({reason})")
        if key not in OPTION_NAMES and not key.startswith("kafka."):
            raise ConfigError(
                f"{key}: unknown option of the inorder-kafka source (known: "
                + ", ".join(sorted(OPTION_NAMES.values()))
                + ", kafka.*)"
            )

    bootstrap = raw.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise ConfigError("kafka.bootstrap.servers: required (e.g. 'localhost:9092')")

    chosen = [n for n in ("subscribe", "subscribepattern", "assign") if raw.get(n, "").strip()]
    if len(chosen) != 1:
        given = ", ".join(OPTION_NAMES[n] for n in chosen) or "none"
        raise ConfigError(
            "subscribe, subscribePattern, assign: exactly one is required (given: " + given + ")"
        )
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[TopicPartition, ...] = ()
    if chosen[0] == "subscribe":
        subscribe = tuple(t.strip() for t in raw["subscribe"].split(",") if t.strip())
        if not subscribe:
            raise ConfigError("subscribe: no topic given")
    elif chosen[0] == "subscribepattern":
        pattern = raw["subscribepattern"].strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"subscribePattern: invalid regex {pattern!r}: {exc}") from None
    else:
        assign = tuple(parse_assign(raw["assign"]))

    starts = [
        n
        for n in ("startingoffsets", "startingoffsetsbytimestamp", "startingtimestamp")
        if n in raw
    ]
    if len(starts) > 1:
        raise ConfigError(
            ", ".join(OPTION_NAMES[n] for n in starts) + ": conflicting, give only one"
        )
    starting = "latest"
    positions: dict[TopicPartition, int] = {}
    timestamps: dict[TopicPartition, int] = {}
    starting_ts: int | None = None
    if "startingoffsets" in raw:
        value = raw["startingoffsets"].strip()
        if value.lower() in ("earliest", "latest"):
            starting = value.lower()
        elif value.startswith("{"):
            starting = "json"
            positions = parse_partition_offsets(value, "startingOffsets")
            for tp, pos in positions.items():
                if pos < EARLIEST:
                    raise ConfigError(
                        f"startingOffsets: {tp} = {pos}: use an offset >= 0, "
                        f"{EARLIEST} (earliest) or {LATEST} (latest)"
                    )
        else:
            raise ConfigError(
                f"startingOffsets: expected earliest, latest or per-partition JSON, got {value!r}"
            )
    elif "startingoffsetsbytimestamp" in raw:
        starting = "timestamp"
        timestamps = parse_partition_offsets(
            raw["startingoffsetsbytimestamp"], "startingOffsetsByTimestamp"
        )
    elif "startingtimestamp" in raw:
        starting = "timestamp"
        starting_ts = _positive_int("startingTimestamp", raw["startingtimestamp"], minimum=0)

    max_per = (
        _positive_int("maxOffsetsPerTrigger", raw["maxoffsetspertrigger"])
        if "maxoffsetspertrigger" in raw
        else None
    )
    min_per = (
        _positive_int("minOffsetsPerTrigger", raw["minoffsetspertrigger"])
        if "minoffsetspertrigger" in raw
        else None
    )
    if max_per is not None and min_per is not None and min_per > max_per:
        raise ConfigError(
            f"minOffsetsPerTrigger, maxOffsetsPerTrigger: conflicting ({min_per} > {max_per})"
        )
    split = (
        _positive_int("maxRecordsPerPartition", raw["maxrecordsperpartition"])
        if "maxrecordsperpartition" in raw
        else None
    )
    markers = _bool("inorder.partitionMarkers", raw.get("inorder.partitionmarkers", "false"))
    if split is not None and markers:
        raise ConfigError(
            "maxRecordsPerPartition: not supported by inorder's engines (they apply each "
            "topic-partition in one task, in offset order, with one state and one watermark "
            "per partition); backend='spark' spreads keys over more tasks instead"
        )
    ranges_only = _bool("inorder.rangesOnly", raw.get("inorder.rangesonly", "false"))
    if ranges_only and not markers:
        raise ConfigError(
            "inorder.rangesOnly: needs inorder.partitionMarkers=true (the marker rows are "
            "all that is read)"
        )
    range_groups = _positive_int(
        "inorder.rangeGroups", raw.get("inorder.rangegroups", "0"), minimum=0
    )
    if range_groups and not ranges_only:
        raise ConfigError(
            "inorder.rangeGroups: needs inorder.rangesOnly=true (a group's task yields marker "
            "rows only; records of several ranges in one task would lose per-range reads)"
        )
    target_batch = (
        _duration("inorder.targetBatchDuration", raw["inorder.targetbatchduration"])
        if raw.get("inorder.targetbatchduration")
        else None
    )
    if target_batch is not None and target_batch.total_seconds() <= 0:
        raise ConfigError("inorder.targetBatchDuration: must be more than 0 seconds")
    if "maxtriggerdelay" in raw and min_per is None:
        raise ConfigError("maxTriggerDelay: only meaningful with minOffsetsPerTrigger")
    delay = (
        _duration("maxTriggerDelay", raw["maxtriggerdelay"])
        if "maxtriggerdelay" in raw
        else timedelta(minutes=15)
    )

    new_start = raw.get("newtopicstartingoffsets", "earliest").strip().lower()
    if new_start not in ("earliest", "latest"):
        raise ConfigError(
            f"newTopicStartingOffsets: expected earliest or latest, got {new_start!r}"
        )
    discovery = (
        _duration("topicDiscoveryInterval", raw["topicdiscoveryinterval"])
        if "topicdiscoveryinterval" in raw
        else DEFAULT_DISCOVERY_INTERVAL
    )
    tick = (
        _positive_int("inorder.tickIntervalMs", raw["inorder.tickintervalms"])
        if "inorder.tickintervalms" in raw
        else None
    )
    kafka = _kafka_passthrough(raw)
    isolation = kafka.get("isolation.level", "read_committed")
    if isolation not in ("read_committed", "read_uncommitted"):
        raise ConfigError(
            f"kafka.isolation.level: expected read_committed or read_uncommitted, got {isolation!r}"
        )
    return SourceOptions(
        bootstrap_servers=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting_offsets=starting,
        starting_positions=positions,
        starting_timestamps=timestamps,
        starting_timestamp=starting_ts,
        max_offsets_per_trigger=max_per,
        max_records_per_partition=split,
        min_offsets_per_trigger=min_per,
        max_trigger_delay=delay,
        fail_on_data_loss=_bool("failOnDataLoss", raw.get("failondataloss", "true")),
        include_headers=_bool("includeHeaders", raw.get("includeheaders", "false")),
        topic_discovery_interval=discovery,
        new_topic_starting_offsets=new_start,
        poll_timeout_ms=_positive_int(
            "kafkaConsumer.pollTimeoutMs",
            raw.get("kafkaconsumer.polltimeoutms", str(DEFAULT_POLL_TIMEOUT_MS)),
        ),
        metadata_timeout_ms=_positive_int(
            "inorder.metadataTimeoutMs",
            raw.get("inorder.metadatatimeoutms", str(DEFAULT_METADATA_TIMEOUT_MS)),
        ),
        group_id_prefix=raw.get("groupidprefix", "inorder-kafka"),
        partition_markers=markers,
        ranges_only=ranges_only,
        range_groups=range_groups,
        target_batch_duration=target_batch,
        tick_interval_ms=tick,
        batch_rows=_positive_int(
            "inorder.batchRows", raw.get("inorder.batchrows", str(DEFAULT_BATCH_ROWS))
        ),
        high_watermarks_file=raw.get("inorder.highwatermarksfile", "").strip() or None,
        kafka=kafka,
    )
