"""Whether a micro-batch's task results cover what the source planned for it.

When the engine's tasks read Kafka themselves, each task learns its ranges from the marker
rows Spark hands it, and reads every one to its end. The driver holds the plan too (the
batch's entry in Spark's offsets log): before anything is committed, every planned range
with offsets must come back as the result of a task that was given exactly that range. A
range lost between the plan and a task (a marker row that never arrived) would otherwise
be committed as read: its records silently never applied, the offsets behind them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from inorder.engine.results import TaskResult
from inorder.errors import InorderError
from inorder.kafka.offsets import SourceOffset
from inorder.kafka.planning import plan_ranges
from inorder.records import TopicPartition

#: Partitions named in the error at most.
LISTED = 10


class PlanNotCovered(InorderError):
    """A micro-batch's results miss planned ranges: nothing of the batch was committed."""


def planned_ranges(
    source_offset: Callable[[int], Mapping[str, Any] | None], batch_id: int
) -> dict[TopicPartition, tuple[int, int]] | None:
    """The offsets ``[start, end)`` the source planned for ``batch_id`` per topic-partition,
    from the source's end offsets of the batch and of the one before as ``source_offset``
    reads them from Spark's offsets log (``None`` when either entry is not there any more).
    The same ranges the source's own planning gives Spark (:func:`plan_ranges`)."""
    end = source_offset(batch_id)
    start = source_offset(batch_id - 1) if batch_id > 0 else {"initial": True}
    if end is None or start is None:
        return None
    ranges = plan_ranges(SourceOffset.from_dict(start), SourceOffset.from_dict(end), markers=True)
    return {r.tp: (r.start, r.end) for r in ranges}


def uncovered(
    planned: Mapping[TopicPartition, tuple[int, int]], results: Iterable[TaskResult]
) -> list[str]:
    """One line per planned range with offsets that no task result reports as given to it
    (missing, or a task given another range); ``[]`` when the results cover the plan."""
    given: dict[TopicPartition, tuple[int, int] | None] = {}
    for r in results:
        given[TopicPartition(r.topic, r.partition)] = (
            (r.planned[0], r.planned[1]) if r.planned else None
        )
    problems = []
    for tp, (start, end) in sorted(planned.items()):
        if end <= start:
            continue
        if tp not in given:
            problems.append(f"{tp.topic}[{tp.partition}] offsets {start}..{end}: no task result")
        elif given[tp] != (start, end):
            got = given[tp]
            told = "no range" if got is None else f"offsets {got[0]}..{got[1]}"
            problems.append(
                f"{tp.topic}[{tp.partition}] offsets {start}..{end}: its task was given {told}"
            )
    return problems


def check_coverage(
    batch_id: int,
    planned: Mapping[TopicPartition, tuple[int, int]],
    results: Iterable[TaskResult],
) -> None:
    """Raise :class:`PlanNotCovered` naming the ranges of ``batch_id`` no result covers."""
    problems = uncovered(planned, results)
    if not problems:
        return
    shown = problems[:LISTED]
    more = f" (and {len(problems) - LISTED} more)" if len(problems) > LISTED else ""
    raise PlanNotCovered(
        f"batch {batch_id}: {len(problems)} planned range(s) not read by any task, so nothing "
        f"of the batch was committed: {'; '.join(shown)}{more}. A re-run plans the batch "
        "again; if this repeats, report it with this line"
    )


__all__ = ["LISTED", "PlanNotCovered", "check_coverage", "planned_ranges", "uncovered"]
