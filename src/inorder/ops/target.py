"""What the operations tools work on: a loaded pipeline and the paths of its checkpoint.

A pipeline's checkpoint root holds two independent logs (see
:mod:`inorder.pipeline.runner`): ``<checkpoint>/spark`` (Spark's offsets and commits logs:
which offsets each micro-batch covered) and ``<checkpoint>/engine`` (inorder's versioned
per-partition state and the processing time of each batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from inorder.checkpoint.layout import CheckpointLayout
from inorder.codecs.base import Codec
from inorder.engine.apply import OrderedApplier
from inorder.engine.reference import DictStateView
from inorder.integrity import Integrity
from inorder.kafka.options import SourceOptions
from inorder.kafka.source_protocol import Source
from inorder.ops.batchlog import Segment
from inorder.pipeline.spec import PipelineSpec
from inorder.processor import Processor, ProcessorTypes, processor_types
from inorder.records import TopicPartition
from inorder.sinks.base import Sink
from inorder.state.checkpoint import CheckpointStore
from inorder.state.entry import KeyEntry, PartitionMeta


@dataclass
class OpsTarget:
    """A pipeline seen by the operations tools (nothing is started by creating one).

    The tools' commands get one from :func:`inorder.assemble.load_target`, which loads the
    pipeline as its last run ran it.
    """

    pipeline: PipelineSpec[Any, Any, Any]
    notes: list[str] = field(default_factory=list)
    """What the operator should know about the settings in use (printed by the commands)."""

    @property
    def processor(self) -> Processor[Any, Any, Any]:
        """The pipeline's processor."""
        processor: Processor[Any, Any, Any] = self.pipeline.processor
        return processor

    @cached_property
    def codec(self) -> Codec[Any]:
        """The codec the pipeline runs with."""
        codec: Codec[Any] = self.pipeline.resolved_codec()
        return codec

    @cached_property
    def integrity(self) -> Integrity:
        """The integrity the pipeline runs with."""
        integrity: Integrity = self.pipeline.resolved_integrity()
        return integrity

    @cached_property
    def types(self) -> ProcessorTypes:
        """The processor's message, state and output types."""
        return processor_types(self.processor)

    @property
    def sink(self) -> Sink:
        """The output sink."""
        sink: Sink = self.pipeline.sink
        return sink

    @cached_property
    def source_options(self) -> SourceOptions:
        """The source's parsed options (bootstrap servers, subscription, client settings).

        A tiered source's read through the archive, then Kafka, like the pipeline's source
        (see :func:`~inorder.kafka.source_protocol.range_reader`).
        """
        source: Source = self.pipeline.source
        return source.read_options()

    @cached_property
    def layout(self) -> CheckpointLayout:
        """The pipeline's checkpoint, built once: every tool reads it through this one layout
        (on S3 it holds the checkpoint's filesystem client)."""
        return self.pipeline.checkpoint_layout()

    @property
    def checkpoint_root(self) -> str:
        """The checkpoint root (no trailing slash)."""
        return self.layout.root

    @property
    def spark_dir(self) -> str:
        """Spark's checkpoint directory (offsets and commits logs)."""
        return self.layout.spark_dir

    @cached_property
    def batch_offset(self) -> int:
        """What ``inorder repair`` added to this checkpoint's batch ids in the output (0 if none).

        After a repair the new checkpoint's batch ``b`` is the output's batch
        ``batch_offset + b`` (see :mod:`inorder.sinks.offset_ids`).
        """
        info = self.layout.info()
        return 0 if info is None else info.offset

    @cached_property
    def engine(self) -> CheckpointStore:
        """inorder's state checkpoint."""
        return CheckpointStore(self.layout.engine_dir)

    def segment_applier(
        self,
        entries: dict[str, KeyEntry],
        tp: TopicPartition,
        segment: Segment,
        meta: PartitionMeta,
        max_events: int | None = None,
    ) -> OrderedApplier:
        """An applier over in-memory state ``entries`` for one batch segment of ``tp``.

        It runs as that batch ran: its batch id and processing time, the partition's meta.
        """
        return OrderedApplier(
            self.processor,
            self.codec,
            self.integrity,
            DictStateView(entries),
            tp.topic,
            tp.partition,
            max(segment.batch_id, 0),
            segment.processing_time_us or 0,
            PartitionMeta(meta.last_offset, meta.max_event_us),
            max_events=max_events,
        )
