"""The Spark backend: the same processor, per key group, on ``transformWithStateInPandas``.

The streaming query (:meth:`SparkBackend.prepare_stream`, applied to the source's streaming
DataFrame before ``foreachBatch``):

1. Stage 1, ``mapInArrow`` on the source's partitions (one task per topic-partition, offset
   order): decode, state key, key group (``crc32(key) % key_groups``), the partition's running
   maximum event time within the batch, and one marker row per key group
   (:func:`~inorder.engine.keygroups.route_task`).
2. ``groupBy("topic", "partition", "grp").transformWithStateInPandas(GroupProcessor)``: Spark
   shuffles the rows of each key group to one call, which checks and stably sorts them by
   offset and applies them with the shared :class:`~inorder.engine.apply.OrderedApplier` over
   the group's Spark state (RocksDB, Avro encoding), staging output through the sink's writer
   (:mod:`inorder.engine.spark_groups`). Each call yields one small result row.
3. ``foreachBatch`` (:meth:`SparkBackend.run_batch`): ONE action collects the result rows;
   the driver raises on a ``fail`` violation or a processor error before committing, then
   commits the dead-letter sink and the sink, exactly once per batch id.

Spark's state store is versioned by batch id: a re-run of batch ``B`` after a crash starts
from the state of ``B - 1`` and stages the same output again; a batch whose sink commit
already happened is run (Spark needs its state version) but not committed twice.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from inorder.codecs.base import Codec
from inorder.engine.batch_report import BatchReport
from inorder.engine.keygroups import ROUTED_DDL, RouteSpec, route_task
from inorder.engine.partition import PartitionBackend
from inorder.engine.results import TaskResult, merge_results, result_of
from inorder.engine.task import INPUT_EXPRS
from inorder.engine.task_spec import TaskSpec
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.processor import Processor
from inorder.sinks.base import Sink
from inorder.state.store import StateOptions

#: Default number of key groups per topic-partition.
DEFAULT_KEY_GROUPS = 8

#: Spark settings the keyed stage needs: RocksDB state with Avro encoding (state schema
#: evolution of Spark's own state rows needs Avro).
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.encodingFormat": "avro",
}

_LAYOUT_FILE = "spark-backend.json"


def _route(spec: RouteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return route_task(spec, batches)


class SparkBackend(PartitionBackend):
    """Runs a processor per key group on Spark's ``transformWithStateInPandas``.

    Same constructor and :meth:`check` as
    :class:`~inorder.engine.partition.PartitionBackend`, plus ``key_groups`` (per
    topic-partition; fixed for the checkpoint's lifetime) and ``shuffle_partitions`` (Spark
    tasks and state partitions of the keyed stage, fixed by Spark when the query's checkpoint
    is created; default: ``spark.sql.shuffle.partitions``). Use :meth:`prepare_stream` on the
    source's streaming DataFrame, then :meth:`run_batch` in ``foreachBatch``.
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

    def stream_spec(self) -> TaskSpec:
        """The task spec shipped with the query (batch id and time are set per batch)."""
        return self._spec(-1, 0)

    def prepare_stream(self, df: Any) -> Any:
        """The streaming DataFrame of per-group result rows, from the source's stream."""
        from inorder.engine.spark_groups import GROUP_RESULT_DDL, GroupProcessor

        if not df.isStreaming:
            raise ConfigError(
                "the spark backend runs inside a streaming query (transformWithState is "
                "streaming-only): pass the source's streaming DataFrame"
            )
        conf = df.sparkSession.conf
        for key, value in STATE_STORE_CONF.items():
            conf.set(key, value)
        if self.shuffle_partitions:
            conf.set("spark.sql.shuffle.partitions", str(self.shuffle_partitions))
        spec = self.stream_spec()
        route = RouteSpec(spec, self.key_groups)
        # The batch's processing time: Spark replaces current_timestamp() in a streaming plan
        # by the batch timestamp it records in its offset log (the same on a re-run).
        routed = df.selectExpr(
            *INPUT_EXPRS, "unix_micros(current_timestamp()) AS now_us"
        ).mapInArrow(functools.partial(_route, route), ROUTED_DDL)
        # timeMode "None": in "ProcessingTime" mode Spark runs a no-data batch after every
        # batch (a timer might be due), forever. Timeouts run at the end of every group's
        # call instead: the marker rows make every group run every batch.
        # The pandas flavour: 4.4x the row-based transformWithState here (docs/engine.md).
        return routed.groupBy("topic", "partition", "grp").transformWithStateInPandas(
            GroupProcessor(spec), GROUP_RESULT_DDL, "Update", "None"
        )

    # -- one micro-batch (foreachBatch body) -------------------------------------------------

    def run_tasks(self, df: Any, batch_id: int) -> list[TaskResult]:
        """Run the batch's keyed stage (state and staged files written), commit nothing."""
        return merge_group_results(self._result_rows(df))

    def _result_rows(self, df: Any) -> list[dict[str, Any]]:
        """The keyed stage's result rows (one action)."""
        if "grp" not in df.columns or "processing_us" not in df.columns:
            raise ConfigError(
                "the spark backend's run_batch expects the micro-batch of prepare_stream(df) "
                "(result rows), not the source's records"
            )
        return [row.asDict() for row in df.collect()]

    def run_batch(self, df: Any, batch_id: int) -> BatchReport:
        """Collect the batch's result rows (one action), then commit, exactly once."""
        started = time.perf_counter()
        if not self._checked:
            self.check()
        results = self._result_rows(df)
        stray = {int(r["batch_id"]) for r in results} - {batch_id}
        if stray:
            raise ConfigError(
                f"micro-batch {batch_id}: result rows of batch {sorted(stray)} "
                "(the keyed stage did not see the streaming batch id)"
            )
        processing_us = max((int(r["processing_us"]) for r in results), default=0)
        if self.sink.is_committed(batch_id):
            report = BatchReport(batch_id=batch_id, committed=False)
        else:
            report = self.commit(batch_id, merge_group_results(results))
            report.duration_seconds = time.perf_counter() - started
        report.processing_time_us = processing_us
        self.batch_commit.after_commit(report)
        return report


def merge_group_results(rows: list[dict[str, Any]]) -> list[TaskResult]:
    """Fold the key groups' result rows into one result per topic-partition."""
    return merge_results(result_of(row) for row in rows)
