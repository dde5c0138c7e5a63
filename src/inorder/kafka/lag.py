"""Consumer lag from a streaming query's progress (no broker call needed).

Spark's ``StreamingQueryProgress`` lists, per source, ``endOffset`` (where the micro-batch
stopped) and ``latestOffset`` (the latest readable offsets the source saw when planning it).
Their difference per topic-partition is the lag.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inorder.kafka.offsets import SourceOffset
from inorder.records import TopicPartition


def _offset(value: Any) -> SourceOffset | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if not isinstance(value, Mapping) or "offsets" not in value:
        return None  # not an inorder-kafka source
    return SourceOffset.from_dict(value)


def _progress(progress: Mapping[str, Any] | str) -> Mapping[str, Any]:
    if isinstance(progress, str):
        loaded: Mapping[str, Any] = json.loads(progress)
        return loaded
    return progress


def lag_from_progress(progress: Mapping[str, Any] | str) -> dict[TopicPartition, int]:
    """Per topic-partition lag (latest readable offset minus processed end offset).

    ``progress`` is ``query.lastProgress`` (a dict) or its JSON text. Partitions the batch
    has not started yet are left out; sources other than ``inorder-kafka`` are ignored.
    """
    lag: dict[TopicPartition, int] = {}
    for source in _progress(progress).get("sources", []) or []:
        latest = _offset(source.get("latestOffset"))
        end = _offset(source.get("endOffset"))
        if latest is None or end is None:
            continue
        for tp, high in latest.positions.items():
            if tp in end.positions:
                lag[tp] = lag.get(tp, 0) + max(0, high - end.positions[tp])
    return lag


def total_lag(progress: Mapping[str, Any] | str) -> int:
    """Sum of :func:`lag_from_progress` over all partitions."""
    return sum(lag_from_progress(progress).values())


def source_counters(progress: Mapping[str, Any] | str) -> dict[str, int]:
    """Cumulative ``lostRecords`` and ``prunedPartitions`` recorded in the source's offset."""
    out = {"lostRecords": 0, "prunedPartitions": 0}
    for source in _progress(progress).get("sources", []) or []:
        end = _offset(source.get("endOffset"))
        if end is not None:
            out["lostRecords"] += end.lost_records
            out["prunedPartitions"] += end.pruned_partitions
    return out


def counters_in_batch(progress: Mapping[str, Any] | str) -> dict[str, int]:
    """This batch's share of the source's cumulative counters: ``lostRecords`` (offsets
    skipped as lost, ``failOnDataLoss=false``) and ``prunedPartitions`` (partitions of
    deleted topics dropped from the plan).

    The source's offset carries cumulative counts; the batch's share is its end offset's
    minus its start offset's (all of it for a first batch, which has no start).
    """
    out = {"lostRecords": 0, "prunedPartitions": 0}
    for source in _progress(progress).get("sources", []) or []:
        end = _offset(source.get("endOffset"))
        if end is None:
            continue
        start = _offset(source.get("startOffset"))
        out["lostRecords"] += end.lost_records - (start.lost_records if start else 0)
        out["prunedPartitions"] += end.pruned_partitions - (start.pruned_partitions if start else 0)
    return {name: max(n, 0) for name, n in out.items()}
