"""What Spark's tasks of the source get: a topic-partition range, or a group of ranges.

Pure planning: the driver's reader (:mod:`inorder.kafka.source`) turns a micro-batch's ranges
into these input partitions, and each is pickled to the task that reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql.datasource import InputPartition


class KafkaInputPartition(InputPartition):
    """One topic-partition range ``[start, end)``: one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaInputPartition({self.topic}[{self.partition}] {self.start}..{self.end})"


class KafkaRangeGroup(InputPartition):
    """Several topic-partition ranges in one Spark task (``inorder.rangeGroups``).

    Only with ``inorder.rangesOnly``: the task yields one marker row per range and its reader
    (inorder's engine) reads each range itself, so a task's cost is per range, not per
    input partition. Each Python data source input partition costs a round trip to a Python
    worker: one per range was most of a small range's time.
    """

    def __init__(self, ranges: list[tuple[str, int, int, int]]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = ranges

    def __repr__(self) -> str:
        inner = ", ".join(f"{t}[{p}] {s}..{e}" for t, p, s, e in self.ranges)
        return f"KafkaRangeGroup({inner})"


#: How much heavier than the balanced packing the stable one may be and still be used.
STABLE_GROUPS_SLACK = 1.25
#: How many more topic-partitions than dealing partitions a group may get when whole topics
#: are dealt (one output file per topic per task) and that packing still be used.
TOPIC_GROUPS_SLACK = 1.1


def group_ranges(ranges: Sequence[tuple[str, int, int, int]], groups: int) -> list[KafkaRangeGroup]:
    """Ranges packed into at most ``groups`` groups, the same ones batch after batch if fair.

    The stable packing deals the ranges in topic-partition order round the groups: while the
    partitions are equally busy, each one stays in the same group (the same task index) every
    batch, so its task mostly lands in the engine worker that holds its state cache. It deals
    whole topics when that spreads the partitions as evenly (within
    :data:`TOPIC_GROUPS_SLACK`; many topics per group): a task then writes one output file per
    topic for all of the topic's partitions, not one per partition
    (:mod:`inorder.engine.task_output`). When that packing's heaviest group is more than
    :data:`STABLE_GROUPS_SLACK` times the balanced packing's (largest range first into the
    lightest group), the balanced one is used. Within a group the ranges keep topic-partition
    order. A topic-partition has one range per micro-batch, so it is in exactly one group: its
    records stay in one task, in offset order.
    """
    count = max(1, groups)
    stable = _deal(ranges, count, by_topic=False)
    by_topic = _deal(ranges, count, by_topic=True)
    if _most_partitions(by_topic) <= _most_partitions(stable) * TOPIC_GROUPS_SLACK:
        stable = by_topic
    balanced: list[list[tuple[str, int, int, int]]] = [[] for _ in range(count)]
    loads = [0] * count
    for r in sorted(ranges, key=lambda r: (-(r[3] - r[2]), r[0], r[1])):
        lightest = loads.index(min(loads))
        balanced[lightest].append(r)
        loads[lightest] += r[3] - r[2]
    heaviest = max(sum(e - s for _, _, s, e in b) for b in stable)
    bins = stable if heaviest <= max(loads) * STABLE_GROUPS_SLACK else balanced
    return [KafkaRangeGroup(sorted(b)) for b in bins if b]


def _deal(
    ranges: Sequence[tuple[str, int, int, int]], count: int, by_topic: bool
) -> list[list[tuple[str, int, int, int]]]:
    """Ranges dealt round ``count`` groups in topic-partition order: each partition (or each
    topic, ``by_topic``) to the next group; a partition's ranges always share a group."""
    bins: list[list[tuple[str, int, int, int]]] = [[] for _ in range(count)]
    dealt: dict[tuple[str, int] | str, int] = {}
    for r in sorted(ranges):  # by topic-partition: never one partition in two groups
        unit: tuple[str, int] | str = r[0] if by_topic else (r[0], r[1])
        bins[dealt.setdefault(unit, len(dealt)) % count].append(r)
    return bins


def _most_partitions(bins: list[list[tuple[str, int, int, int]]]) -> int:
    """The most topic-partitions any group holds."""
    return max(len({(t, p) for t, p, _, _ in b}) for b in bins)
