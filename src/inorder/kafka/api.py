"""``KafkaSource``: the Kafka source as pipelines configure it, turned into Spark options."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from inorder.errors import ConfigError
from inorder.kafka.options import SourceOptions, parse_options
from inorder.redaction import redact


def _millis(value: str | timedelta | float | int) -> str:
    if isinstance(value, timedelta):
        return str(int(value.total_seconds() * 1000))
    if isinstance(value, int | float):
        return str(int(value * 1000))  # seconds
    return value


#: A backlog is read in micro-batches of about this long (each a commit, a progress line and
#: the most a stop or a crash has to redo), sized from the rate the previous ones reached.
DEFAULT_TARGET_BATCH_DURATION = "20 seconds"


@dataclass(frozen=True, repr=False)
class KafkaSource:
    """Where a pipeline reads from: one of ``topic_pattern``, ``topics`` or ``assign``.

    ``starting_offsets`` is ``"earliest"``, ``"latest"`` or per-partition offsets
    (``{"topic": {"0": 42}}``, as a dict or JSON text); it applies when a query starts
    without a checkpoint. ``topic_discovery_interval`` is a duration (``"30 seconds"``, a
    ``timedelta`` or seconds as a number). ``kafka_options`` are librdkafka settings (SASL,
    SSL, ...) passed through; they are never printed. ``options`` adds any other source option
    by its Spark name (see docs/kafka-source.md). ``archive`` (the path of an
    ``inorder archive`` dataset) reads each partition from the archive up to its end and then
    from Kafka (see docs/archive.md): that reading is
    :class:`~inorder.archive.tiered_source.TieredSource`'s, which a ``Pipeline`` turns such a
    source into when it is built (this class reads Kafka only, so ``kafka/`` needs nothing of
    ``archive/``). ``target_batch_duration`` sizes micro-batches to take
    about that long while there is a backlog (default :data:`DEFAULT_TARGET_BATCH_DURATION`;
    ``None`` or ``"off"``: a micro-batch takes everything available, up to
    ``max_offsets_per_trigger``).
    """

    bootstrap_servers: str
    topic_pattern: str | None = None
    topics: Sequence[str] | None = None
    assign: Mapping[str, Sequence[int]] | str | None = None
    starting_offsets: str | Mapping[str, Mapping[str, int]] = "earliest"
    max_offsets_per_trigger: int | None = None
    target_batch_duration: str | timedelta | float | None = DEFAULT_TARGET_BATCH_DURATION
    fail_on_data_loss: bool = True
    include_headers: bool = False
    kafka_options: Mapping[str, str] = field(default_factory=dict)
    topic_discovery_interval: str | timedelta | float | None = None
    new_topic_starting_offsets: str = "earliest"
    options: Mapping[str, str] = field(default_factory=dict)
    archive: str | None = None
    archive_storage_options: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        what = (
            f"topic_pattern={self.topic_pattern!r}"
            if self.topic_pattern
            else f"topics={list(self.topics or [])!r}"
            if self.topics
            else f"assign={self.assign!r}"
        )
        return (
            f"KafkaSource(bootstrap_servers={self.bootstrap_servers!r}, {what}, "
            f"kafka_options={redact(self.kafka_options)!r})"
        )

    @property
    def reads_archive(self) -> bool:
        """Whether an archive is read before Kafka (``archive`` is set)."""
        return bool(self.archive)

    def _kafka_only(self) -> None:
        """Refuse to read Kafka alone when an archive was asked for (silently wrong data)."""
        if self.archive:
            raise ConfigError(
                "archive: a KafkaSource naming an archive is read through "
                "inorder.archive.TieredSource (a Pipeline turns it into one when it is built; "
                "elsewhere use TieredSource.of(source))"
            )

    def read_options(self) -> SourceOptions:
        """The parsed options the operations tools read ranges and metadata with."""
        self._kafka_only()
        return parse_options(self.to_options())

    def to_options(self) -> dict[str, str]:
        """The ``readStream`` options (Spark Kafka connector names)."""
        opts: dict[str, str] = {"kafka.bootstrap.servers": self.bootstrap_servers}
        given = [
            n
            for n, v in (
                ("topic_pattern", self.topic_pattern),
                ("topics", self.topics),
                ("assign", self.assign),
            )
            if v
        ]
        if len(given) != 1:
            raise ConfigError(
                "topic_pattern, topics, assign: exactly one is required (given: "
                + (", ".join(given) or "none")
                + ")"
            )
        if self.topic_pattern:
            opts["subscribePattern"] = self.topic_pattern
        elif self.topics:
            opts["subscribe"] = ",".join(self.topics)
        else:
            assign = self.assign
            opts["assign"] = (
                assign
                if isinstance(assign, str)
                else json.dumps({t: list(p) for t, p in (assign or {}).items()})
            )
        starting = self.starting_offsets
        opts["startingOffsets"] = (
            starting
            if isinstance(starting, str)
            else json.dumps({t: dict(p) for t, p in starting.items()})
        )
        if self.max_offsets_per_trigger is not None:  # 0 too: the parser rejects it by name
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        target = self.target_batch_duration
        if target is not None and not (isinstance(target, str) and target.strip() == "off"):
            opts["inorder.targetBatchDuration"] = _millis(target)
        opts["failOnDataLoss"] = "true" if self.fail_on_data_loss else "false"
        opts["includeHeaders"] = "true" if self.include_headers else "false"
        if self.topic_discovery_interval is not None:
            opts["topicDiscoveryInterval"] = _millis(self.topic_discovery_interval)
        opts["newTopicStartingOffsets"] = self.new_topic_starting_offsets
        for key, value in self.kafka_options.items():
            opts[key if key.startswith("kafka.") else f"kafka.{key}"] = str(value)
        extra = {k: str(v) for k, v in self.options.items()}
        lowered = {k.lower() for k in extra}
        # An option given by its Spark name in `options` wins over the field's value (names
        # are case-insensitive); a timestamp start replaces the default startingOffsets.
        if lowered & {"startingoffsetsbytimestamp", "startingtimestamp"} and (
            self.starting_offsets == "earliest"
        ):
            lowered.add("startingoffsets")
        opts = {k: v for k, v in opts.items() if k.lower() not in lowered}
        opts.update(extra)
        return opts

    def check(
        self, extra_options: Mapping[str, str] | None = None, *, bounded: bool = False
    ) -> list[str]:
        """Validate the options and reach the broker (bounded time); raise ``ConfigError``.

        Returns notes for the user: which topics a ``topic_pattern`` matches now, or a warning
        naming the closest topic names when it matches none. ``bounded`` says the query reads
        what is there now and ends (trigger available-now or once): a pattern matching nothing
        then could only read nothing, so it is refused (``ConfigError``) instead, before
        anything is recorded about the run. A long-running query may wait for its topics.
        """
        from inorder.kafka.admin import KafkaAdmin

        parsed = parse_options({**self.to_options(), **(extra_options or {})})
        admin = KafkaAdmin(parsed)
        notes: list[str] = []
        if parsed.subscribe or parsed.assign:
            admin.check_subscription()
        elif parsed.subscribe_pattern is not None:
            pattern, servers = parsed.subscribe_pattern, parsed.bootstrap_servers
            every = admin.topic_names()
            matched = [t for t in every if parsed.pattern and parsed.pattern.fullmatch(t)]
            if not matched and bounded:
                raise ConfigError(no_match_error(pattern, every, servers))
            notes.append(
                pattern_note(
                    pattern, matched, servers, parsed.topic_discovery_interval, existing=every
                )
            )
        return notes

    def load(self, spark: Any, extra_options: Mapping[str, str] | None = None) -> Any:
        """The streaming DataFrame (registers the source, checks options and broker first)."""
        from inorder.kafka.source import KafkaDataSource
        from inorder.spark.worker_pools import SOURCE_POOL, in_pool

        self._kafka_only()
        options = {**self.to_options(), **(extra_options or {})}
        self.check(extra_options)
        # Marker rows only (the engine reads the ranges): the source pool, light workers.
        ranges_only = str(options.get("inorder.rangesOnly", "")).lower() == "true"
        with in_pool(spark, SOURCE_POOL if ranges_only else None):
            spark.dataSource.register(KafkaDataSource)
        return spark.readStream.format(KafkaDataSource.name()).options(**options).load()


#: Topic names a subscription note lists before it only counts the rest.
LISTED_TOPICS = 10
#: Close topic names suggested for a pattern that matches none, and how close they must be.
SUGGESTED_TOPICS = 3
SUGGESTION_CUTOFF = 0.6

# Regex syntax left out of a pattern's literal text: character classes and repeat counts as a
# whole (their letters are no part of any name), then every metacharacter; an escaped
# character stands for itself.
_CLASSES = re.compile(r"\[[^\]]*\]|\{\d*,?\d*\}")
_SYNTAX = re.compile(r"\\(.)|[.*+?^$()|]")


def closest_topics(pattern: str, topics: Iterable[str]) -> list[str]:
    """The topic names closest to ``pattern`` (``difflib``), best first; internal ones left out.

    A pattern is mostly a name with a wildcard (``site-.*``): its literal text is compared
    with each whole name and with the name's beginning of the same length, and the better of
    the two counts. Names starting with ``_`` (the broker's and tools' own topics, such as
    ``__consumer_offsets`` or ``_schemas``) are never suggested.
    """
    literal = _SYNTAX.sub(lambda m: m.group(1) or "", _CLASSES.sub("", pattern))
    if not literal:
        return []
    scored = []
    for name in topics:
        if name.startswith("_"):
            continue
        whole = difflib.SequenceMatcher(None, literal, name).ratio()
        start = difflib.SequenceMatcher(None, literal, name[: len(literal)]).ratio()
        score = max(whole, start)
        if score >= SUGGESTION_CUTOFF:
            scored.append((-score, name))
    return [name for _, name in sorted(scored)[:SUGGESTED_TOPICS]]


def _suggestion(pattern: str, existing: Sequence[str]) -> str:
    close = closest_topics(pattern, existing)
    if close:
        return "closest topics: " + ", ".join(close)
    return "no topic name is close to it"


def no_match_error(pattern: str, existing: Sequence[str], servers: str) -> str:
    """The refusal of a pattern that matches nothing under a trigger that ends (one line)."""
    hint = _suggestion(pattern, existing)
    return (
        f"topic_pattern {pattern!r} matches no topic on {servers} ({hint}): under trigger "
        "available-now or once the run would read nothing; correct the pattern, or create a "
        "matching topic first"
    )


def pattern_note(
    pattern: str,
    topics: Sequence[str],
    servers: str,
    interval: timedelta,
    existing: Sequence[str] = (),
) -> str:
    """The start-time note on a topic pattern: the topics it matches, or a warning if none.

    A pattern that matches nothing is legal for a long-running query (topics may be created
    later) but is most often a typo, which would otherwise look like a healthy run reading
    zero records: the warning names the closest of the ``existing`` topic names.
    """
    if not topics:
        return (
            f"warning: topic_pattern {pattern!r} matches no topic on {servers} "
            f"({_suggestion(pattern, existing)}): nothing is read until a matching topic "
            f"appears (looked for every {interval.total_seconds():g} s, "
            "topic_discovery_interval)"
        )
    shown = ", ".join(topics[:LISTED_TOPICS])
    if len(topics) > LISTED_TOPICS:
        shown += f", ... ({len(topics) - LISTED_TOPICS} more)"
    noun = "topic" if len(topics) == 1 else "topics"
    return f"subscribed to {len(topics)} {noun} matching {pattern!r}: {shown}"
