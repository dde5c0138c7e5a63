"""Comparing two versions of a job side by side, and the switch-over point.

Two versions of a job write two outputs (each with its own checkpoint). Over the offsets
both have processed, :func:`compare_outputs` diffs their rows as ``inorder validate`` does:
per ``(topic, partition, offset)``, as multisets of the compared columns, ignoring
``batch_id`` and ``job_version`` (and any column only one side has, such as a column the
new version adds). Once the diff is clean, readers switch to the new output from the
offsets it started at: :func:`switched_rows` gives the combined view (old rows below the
switch offsets, new rows from them on).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.records import TopicPartition

IGNORED = ("batch_id", "job_version")


@dataclass
class OutputDiff:
    """Result of :func:`compare_outputs`."""

    columns: list[str]
    rows_old: int = 0
    rows_new: int = 0
    only_old: int = 0
    only_new: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        """Whether both outputs hold the same rows over the compared offsets."""
        return self.only_old == 0 and self.only_new == 0


def _offsets_filter(
    table: pa.Table,
    start: Mapping[TopicPartition, int] | None,
    end: Mapping[TopicPartition, int] | None,
) -> pa.Table:
    """Rows whose (topic, partition) is in ``start`` with ``start <= offset < end``."""
    if start is None and end is None:
        return table
    keep = []
    topics = table.column("topic").to_pylist()
    parts = table.column("partition").to_pylist()
    offsets = table.column("offset").to_pylist()
    for t, p, o in zip(topics, parts, offsets, strict=True):
        tp = TopicPartition(t, int(p))
        lo = start.get(tp) if start is not None else 0
        hi = end.get(tp) if end is not None else None
        keep.append(lo is not None and o >= lo and (hi is None or o < hi))
    return table.filter(pa.array(keep, pa.bool_()))


def compare_outputs(
    old: pa.Table,
    new: pa.Table,
    *,
    start: Mapping[TopicPartition, int] | None = None,
    end: Mapping[TopicPartition, int] | None = None,
    columns: Sequence[str] | None = None,
) -> OutputDiff:
    """Diff two outputs over ``[start, end)`` per topic-partition (both optional)."""
    a = _offsets_filter(old, start, end)
    b = _offsets_filter(new, start, end)
    cols = (
        list(columns)
        if columns is not None
        else [c for c in a.column_names if c in b.column_names and c not in IGNORED]
    )
    diff = OutputDiff(columns=cols, rows_old=a.num_rows, rows_new=b.num_rows)
    ca = Counter(tuple(sorted(r.items())) for r in a.select(cols).to_pylist())
    cb = Counter(tuple(sorted(r.items())) for r in b.select(cols).to_pylist())
    for kind, left in (("old_only", ca - cb), ("new_only", cb - ca)):
        n = sum(left.values())
        if kind == "old_only":
            diff.only_old = n
        else:
            diff.only_new = n
        for row in list(left)[:5]:
            diff.samples.append({"kind": kind, "row": dict(row)})
    return diff


def switched_rows(
    old: pa.Table, new: pa.Table, switch: Mapping[TopicPartition, int], columns: Sequence[str]
) -> pa.Table:
    """The combined output after switching: old rows below ``switch``, new rows from it on."""
    below = {tp: 0 for tp in switch}
    before = _offsets_filter(old, below, switch).select(list(columns))
    after = _offsets_filter(new, switch, None).select(list(columns))
    combined = pa.concat_tables([before, after.cast(before.schema)])
    order = pc.sort_indices(
        combined,
        sort_keys=[("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")],
    )
    return combined.take(order)
