"""The source's offset: where each topic-partition stands, in one canonical JSON form.

Spark stores the offsets a source returns as JSON and decides whether a micro-batch has new
data by comparing those JSON strings. Two equal offsets must therefore serialise to the same
bytes: keys are sorted (topics, then partition ids compared as strings, exactly the order
``json.dumps(..., sort_keys=True)`` produces) and partition ids are strings. Otherwise Spark
runs spurious empty micro-batches.

Canonical form (optional keys appear only when set)::

    {"initial": true,                      # only in the initial offset of a new query
     "lostRecords": 12,                    # cumulative records skipped (failOnDataLoss=false)
     "offsets": {"topic": {"0": 42, "1": 7}},
     "prunedPartitions": 3,                # cumulative partitions pruned (deleted topics)
     "starts": {"topic": {"1": 0}},        # where ranges begin that do not continue
     "tick": 28561}                        # only with inorder.tickIntervalMs

``offsets`` holds, per topic-partition, the next offset to read (exclusive end of what the
micro-batch ending at this offset covers). ``starts`` holds, for partitions that are read for
the first time in the micro-batch ending at this offset (a new query's partitions, topics and
partitions found later), where their range begins: the offset a micro-batch starts from does
not know them. With it, a partition's starting position is in Spark's offset log, in the
same entry as the first range read from it, so a replayed micro-batch plans the same ranges.
A partition whose next offsets expired before they were read (skipped under
``failOnDataLoss=false``) gets a start too: its range begins at the log start, and the
skipped offsets, counted in ``lostRecords`` once, are not met again by the task.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from inorder.errors import ConfigError
from inorder.records import TopicPartition

#: Spark's special per-partition values in ``startingOffsets`` JSON.
EARLIEST = -2
LATEST = -1


def _parse_positions(raw: Mapping[str, Mapping[str, Any]]) -> dict[TopicPartition, int]:
    positions: dict[TopicPartition, int] = {}
    for topic, parts in raw.items():
        for part, pos in parts.items():
            positions[TopicPartition(str(topic), int(part))] = int(pos)
    return positions


def _sorted_positions(positions: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    nested: dict[str, dict[str, int]] = {}
    for tp in sorted(positions, key=lambda t: (t.topic, str(t.partition))):
        nested.setdefault(tp.topic, {})[str(tp.partition)] = int(positions[tp])
    return nested


@dataclass(frozen=True)
class SourceOffset:
    """Positions of every known topic-partition, plus the optional tick and counters."""

    positions: Mapping[TopicPartition, int] = field(default_factory=dict)
    tick: int | None = None
    initial: bool = False
    lost_records: int = 0
    pruned_partitions: int = 0
    starts: Mapping[TopicPartition, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The canonical dict (insertion order = sorted keys), ready for ``json.dumps``."""
        out: dict[str, Any] = {}
        if self.initial:
            out["initial"] = True
        if self.lost_records:
            out["lostRecords"] = self.lost_records
        out["offsets"] = _sorted_positions(self.positions)
        if self.pruned_partitions:
            out["prunedPartitions"] = self.pruned_partitions
        if self.starts:
            out["starts"] = _sorted_positions(self.starts)
        if self.tick is not None:
            out["tick"] = self.tick
        return out

    def to_json(self) -> str:
        """Canonical JSON text (identical to ``json.dumps(self.to_dict(), sort_keys=True)``)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceOffset:
        """Parse an offset produced by :meth:`to_dict` (as Spark hands it back)."""
        tick = data.get("tick")
        return cls(
            positions=_parse_positions(data.get("offsets", {})),
            tick=int(tick) if tick is not None else None,
            initial=bool(data.get("initial", False)),
            lost_records=int(data.get("lostRecords", 0)),
            pruned_partitions=int(data.get("prunedPartitions", 0)),
            starts=_parse_positions(data.get("starts", {})),
        )

    def without_starts(self) -> SourceOffset:
        """The same positions and counters, without ``starts`` (for "anything new?" checks)."""
        return replace(self, starts={}) if self.starts else self

    @classmethod
    def from_json(cls, text: str) -> SourceOffset:
        """Parse canonical JSON text."""
        loaded: dict[str, Any] = json.loads(text)
        return cls.from_dict(loaded)


def parse_partition_offsets(text: str, option: str) -> dict[TopicPartition, int]:
    """Parse Spark's per-partition JSON (``{"topic": {"0": 23, "1": -2}}``).

    Used for ``startingOffsets``, ``startingOffsetsByTimestamp`` and ``assign``-style values.
    Raises :class:`ConfigError` naming ``option`` when the text is not of that shape.
    """
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{option}: not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f'{option}: expected a JSON object like {{"topic": {{"0": 23}}}}')
    result: dict[TopicPartition, int] = {}
    for topic, parts in loaded.items():
        if not isinstance(parts, dict):
            raise ConfigError(
                f'{option}: topic {topic!r} must map partition ids to numbers, e.g. {{"0": 23}}'
            )
        for part, value in parts.items():
            try:
                partition = int(part)
            except ValueError:
                raise ConfigError(
                    f"{option}: partition id {part!r} of {topic!r} is not a number"
                ) from None
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{option}: value for {topic}[{part}] must be an integer")
            result[TopicPartition(topic, partition)] = value
    return result


def parse_assign(text: str) -> list[TopicPartition]:
    """Parse Spark's ``assign`` JSON (``{"topicA": [0, 1], "topicB": [2]}``)."""
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"assign: not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(loaded, dict) or not loaded:
        raise ConfigError('assign: expected a JSON object like {"topicA": [0, 1]}')
    result: list[TopicPartition] = []
    for topic, parts in loaded.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in parts
        ):
            raise ConfigError(f"assign: topic {topic!r} must map to a list of partition numbers")
        result.extend(TopicPartition(topic, p) for p in parts)
    return sorted(set(result))
