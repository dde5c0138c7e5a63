"""The Spark backend: the same processor, parallel per key group through a Spark shuffle.

Per micro-batch ``B`` (:meth:`SparkBackend.run_batch`, the ``foreachBatch`` body):

1. Stage 1, ``mapInArrow`` on the source's partitions (one task per topic-partition, offset
   order): decode, key, key group (``crc32(key) % key_groups``), and the partition's
   watermark as of each record (:func:`~inorder.engine.keygroups.route_task`).
2. ``repartition`` on ``(topic, partition, grp)``: the shuffle that spreads the keys of one
   partition over several tasks, so parallelism is no longer capped by the partition count.
3. Stage 2, ``mapInArrow``: each task checks and stably sorts its rows by offset and applies
   each key group with the shared :class:`~inorder.engine.apply.OrderedApplier` over the
   group's versioned state (:func:`~inorder.engine.keygroups.group_task`), staging output
   through the sink's writer.
4. One action collects the small result rows; the driver raises on a ``fail`` violation
   before committing, records each partition's maximum event time (the next batch's
   watermark base), then commits the dead-letter sink and the sink, exactly once per batch id.

State, replays, timers, policies, tiers and recovery are the partition backend's (same store,
same applier, same commit protocol): a re-run of ``B`` loads every group's state as of
``B - 1``. The number of key groups is fixed when the checkpoint is created.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from inorder.codecs.base import Codec
from inorder.engine.keygroups import (
    GROUP_RESULT_DDL,
    ROUTED_DDL,
    RouteSpec,
    group_task,
    route_task,
)
from inorder.engine.partition import BatchReport, PartitionBackend
from inorder.engine.task import INPUT_EXPRS, TaskSpec
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.processor import Processor
from inorder.sinks.base import Sink
from inorder.state.store import StateOptions

#: Default number of key groups per topic-partition.
DEFAULT_KEY_GROUPS = 8

_LAYOUT_FILE = "spark-backend.json"


def _route(spec: RouteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return route_task(spec, batches)


def _groups(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return group_task(spec, batches)


class SparkBackend(PartitionBackend):
    """Runs a processor over micro-batches with key groups spread over Spark tasks.

    Same constructor, :meth:`check` and :meth:`run_batch` as
    :class:`~inorder.engine.partition.PartitionBackend`, plus ``key_groups`` (per
    topic-partition; fixed for the checkpoint's lifetime) and ``shuffle_partitions`` (Spark
    tasks of the keyed stage; default: Spark's ``spark.sql.shuffle.partitions``).
    """

    def __init__(
        self,
        processor: Processor[Any, Any, Any],
        codec: Codec[Any],
        integrity: Integrity,
        checkpoint: str,
        sink: Sink,
        dead_letter_sink: Sink | None = None,
        state_options: StateOptions | None = None,
        storage_options: dict[str, str] | None = None,
        *,
        key_groups: int = DEFAULT_KEY_GROUPS,
        shuffle_partitions: int | None = None,
    ) -> None:
        super().__init__(
            processor,
            codec,
            integrity,
            checkpoint,
            sink,
            dead_letter_sink,
            state_options,
            storage_options,
        )
        if key_groups < 1:
            raise ConfigError(f"key_groups must be at least 1, not {key_groups}")
        self.key_groups = key_groups
        self.shuffle_partitions = shuffle_partitions

    def check(self) -> None:
        """The partition backend's checks, plus the checkpoint's key-group layout."""
        super().check()
        layout = self.checkpoint.read_json(_LAYOUT_FILE)
        if layout is None:
            self.checkpoint.write_json({"key_groups": self.key_groups}, _LAYOUT_FILE)
        elif int(layout["key_groups"]) != self.key_groups:
            raise ConfigError(
                f"key_groups is {self.key_groups} but the checkpoint was created with "
                f"{layout['key_groups']}: state is laid out by key group; use "
                f"key_groups={layout['key_groups']} or a new checkpoint"
            )

    # -- partition progress (watermark base) --------------------------------------------------

    def _max_event_us(self, batch_id: int) -> dict[str, int]:
        """Each partition's max event time after the newest batch below ``batch_id``."""
        for previous in range(batch_id - 1, -1, -1):
            doc = self.checkpoint.read_json("partitions", f"{previous:020d}.json")
            if doc is not None:
                return {k: int(v) for k, v in doc["max_event_us"].items()}
        return {}

    # -- one micro-batch ---------------------------------------------------------------------

    def plan(self, df: Any, batch_id: int) -> Any:
        """The DataFrame of per-group result rows for ``df`` (no action run)."""
        spec = self.spec(batch_id)
        route = RouteSpec(spec, self.key_groups, self._max_event_us(batch_id))
        projected = df.selectExpr(*INPUT_EXPRS)
        routed = projected.mapInArrow(functools.partial(_route, route), ROUTED_DDL)
        n = self.shuffle_partitions
        shuffled = (
            routed.repartition(n, "topic", "partition", "grp")
            if n
            else routed.repartition("topic", "partition", "grp")
        )
        return shuffled.mapInArrow(functools.partial(_groups, spec), GROUP_RESULT_DDL)

    def run_batch(self, df: Any, batch_id: int) -> BatchReport:
        """Apply, then commit, one micro-batch (``foreachBatch`` body)."""
        started = time.perf_counter()
        if not self._checked:
            self.check()
        if self.sink.is_committed(batch_id):
            return BatchReport(batch_id=batch_id, committed=False)
        results = self.run_tasks(df, batch_id)
        merged = merge_group_results(results)
        failures = [r for r in merged if r["failed"]]
        if not failures:
            progress = self._max_event_us(batch_id)
            for r in results:
                if r["max_event_us"] is not None:
                    name = f"{r['topic']}[{r['partition']}]"
                    progress[name] = max(progress.get(name, r["max_event_us"]), r["max_event_us"])
            self.checkpoint.write_json(
                {"batch_id": batch_id, "max_event_us": progress},
                "partitions",
                f"{batch_id:020d}.json",
            )
        report = self.commit(batch_id, merged)
        report.duration_seconds = time.perf_counter() - started
        return report


def merge_group_results(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold the key groups' result rows into one row per topic-partition."""
    by_tp: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        by_tp.setdefault((r["topic"], int(r["partition"])), []).append(r)
    merged: list[dict[str, Any]] = []
    for (topic, partition), rows in sorted(by_tp.items()):
        counts: dict[str, int] = {}
        counters: dict[str, int] = {}
        timings: dict[str, float] = {}
        violations: list[dict[str, Any]] = []
        files: list[Any] = []
        dl_files: list[Any] = []
        failed = [json.loads(r["failed"]) for r in rows if r["failed"]]
        for r in rows:
            for rule, n in json.loads(r["violation_counts"]).items():
                counts[rule] = counts.get(rule, 0) + n
            for name, n in json.loads(r["counters"]).items():
                counters[name] = counters.get(name, 0) + n
            for name, t in json.loads(r["timings"]).items():
                timings[name] = timings.get(name, 0.0) + t
            violations.extend(json.loads(r["violations"]))
            files.extend(json.loads(r["files"] or "[]"))
            dl_files.extend(json.loads(r["dead_letter_files"] or "[]"))
        firsts = [r["first_offset"] for r in rows if r["first_offset"] is not None]
        violations.sort(key=lambda v: (v["offset"], v["rule"]))
        merged.append(
            {
                "topic": topic,
                "partition": partition,
                "first_offset": min(firsts) if firsts else None,
                "last_offset": max(int(r["last_offset"]) for r in rows),
                "records": sum(int(r["records"]) for r in rows),
                "output_rows": sum(int(r["output_rows"]) for r in rows),
                "files": json.dumps(files),
                "dead_letter_files": json.dumps(dl_files),
                "state_keys": sum(int(r["state_keys"]) for r in rows),
                "violations": json.dumps(violations),
                "violation_counts": json.dumps(counts),
                "counters": json.dumps(counters),
                "timings": json.dumps(timings),
                "failed": json.dumps(min(failed, key=lambda v: v["offset"])) if failed else None,
            }
        )
    return merged
