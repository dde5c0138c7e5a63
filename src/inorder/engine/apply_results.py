"""What the ordered apply of one topic-partition produced in one micro-batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inorder.engine.violations import PROCESSOR_ERROR, DeadLetter, ViolationEvent

if TYPE_CHECKING:
    from inorder.processor import Processor


def _no_problem(rows: list[Any]) -> str | None:
    return None


#: The checks of the last few processors: a task builds an applier per topic-partition, all
#: for the same processor object, and finding the output type and its encoder cost ~25 us.
#: Keyed by ``id`` with the processor kept beside its check, so that an id reused by a later
#: object is never taken for it; few entries, as each batch's task spec brings a new object.
_CHECKERS: dict[int, tuple[object, Callable[[list[Any]], str | None]]] = {}
_CHECKERS_KEPT = 4


def row_checker(processor: Processor[Any, Any, Any]) -> Callable[[list[Any]], str | None]:
    """The output schema's exact-fit check for the rows ``processor`` yields."""
    known = _CHECKERS.get(id(processor))
    if known is not None and known[0] is processor:
        return known[1]
    from inorder.processor import processor_types
    from inorder.schema import row_encoder

    check: Callable[[list[Any]], str | None]
    try:
        check = row_encoder(processor_types(processor).out).row_problem
    except Exception:  # no usable output type: the backend's check names the problem
        check = _no_problem
    while len(_CHECKERS) >= _CHECKERS_KEPT:
        del _CHECKERS[next(iter(_CHECKERS))]
    _CHECKERS[id(processor)] = (processor, check)
    return check


class ApplyResults:
    """The outcome of applying one topic-partition's records for one batch.

    :attr:`rows` with :attr:`row_offsets` (the origin offset of each row), :attr:`violations`
    (at most ``max_events`` of them, all counted in :attr:`violation_counts`),
    :attr:`dead_letters`, :attr:`counters`, :attr:`first_offset` (the first record consumed)
    and :attr:`failed` (the event that stopped the partition, if any).
    """

    def __init__(
        self, topic: str, partition: int, processor_name: str, max_events: int | None
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.max_events = max_events
        self._processor_name = processor_name
        self.rows: list[Any] = []
        self.row_offsets: list[int] = []
        self.violations: list[ViolationEvent] = []
        self.dead_letters: list[DeadLetter] = []
        self.violation_counts: dict[str, int] = {}
        self.counters: dict[str, int] = {
            "records": 0,
            "replayed": 0,
            "ignored": 0,
            "duplicates": 0,
            "timeouts": 0,
        }
        self.failed: ViolationEvent | None = None
        self.first_offset: int | None = None

    def _emit(self, rows: list[Any], offset: int) -> None:
        if rows:
            self.rows.extend(rows)
            self.row_offsets.extend([offset] * len(rows))

    def _record_event(self, event: ViolationEvent) -> None:
        self.violation_counts[event.rule] = self.violation_counts.get(event.rule, 0) + 1
        if self.max_events is None or len(self.violations) < self.max_events:
            self.violations.append(event)

    def _bug(self, exc: BaseException, key: str | None, offset: int, where: str) -> None:
        """User code raised something other than a Violation: a bug, which stops the
        partition whatever the policy (skipping records because of it would lose them)."""
        detail = f"{self._processor_name}.{where} raised {type(exc).__name__}: {exc}"
        event = ViolationEvent(
            self.topic, self.partition, offset, key, PROCESSOR_ERROR, detail, "fail"
        )
        self._record_event(event)
        self.failed = event
