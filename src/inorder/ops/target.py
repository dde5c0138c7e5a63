"""What the operations tools work on: a loaded pipeline and the paths of its checkpoint.

A pipeline's checkpoint root holds two independent logs (see
:mod:`inorder.pipeline.runner`): ``<checkpoint>/spark`` (Spark's offsets and commits logs:
which offsets each micro-batch covered) and ``<checkpoint>/engine`` (inorder's versioned
per-partition state and the processing time of each batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from inorder.codecs.base import Codec
from inorder.engine.apply import OrderedApplier
from inorder.engine.reference import DictStateView
from inorder.integrity import Integrity
from inorder.kafka.options import SourceOptions
from inorder.kafka.source_protocol import Source
from inorder.ops.batchlog import Segment
from inorder.pipeline.checkpoint_layout import CheckpointLayout
from inorder.pipeline.identity import SETTINGS_FIELD, RecordedSettings
from inorder.processor import Processor, ProcessorTypes, processor_types
from inorder.records import TopicPartition
from inorder.sinks.base import Sink
from inorder.state.checkpoint import CheckpointStore
from inorder.state.entry import KeyEntry, PartitionMeta


@dataclass
class OpsTarget:
    """A pipeline seen by the operations tools (nothing is started by creating one)."""

    pipeline: Any
    notes: list[str] = field(default_factory=list)
    """What the operator should know about the settings in use (printed by the commands)."""

    @classmethod
    def load(cls, reference: str, overrides: Mapping[str, Any] | None = None) -> OpsTarget:
        """Load a pipeline from a TOML file or ``module:attribute``, as its last run ran it.

        A TOML pipeline gets the ``--set`` overrides its last run recorded in the checkpoint
        (``overrides`` given here win), so the tools judge the output that run wrote.
        """
        from inorder.assemble import load_pipeline

        given = dict(overrides or {})
        pipeline = load_pipeline(reference, given)
        if not reference.endswith(".toml"):
            return cls(pipeline)
        info = CheckpointLayout.of(pipeline.checkpoint).read_info() or {}
        recorded = RecordedSettings.from_json(info.get(SETTINGS_FIELD))
        if recorded is None:
            return cls(pipeline)
        replay = {**recorded.replayable_overrides(), **given}
        notes = []
        if replay != given:
            pipeline = load_pipeline(reference, replay)
            shown = ", ".join(f"{k}={v!r}" for k, v in sorted(replay.items()) if k not in given)
            notes.append(
                f"using the overrides the last run ({recorded.recorded_at}) recorded in the "
                f"checkpoint: {shown}"
            )
        masked = sorted(k for k, v in recorded.overrides.items() if k not in replay)
        if masked:
            notes.append(
                f"the last run overrode {', '.join(masked)} with a secret that is not recorded: "
                "using the file's value (pass it again with --set if it differs)"
            )
        if recorded.source and recorded.source not in ("python", reference):
            notes.append(f"the last run used {recorded.source}, not {reference}")
        return cls(pipeline, notes)

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

    @property
    def layout(self) -> CheckpointLayout:
        """The pipeline's checkpoint."""
        return CheckpointLayout.of(self.pipeline.checkpoint)

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
        info = self.layout.read_info() or {}
        return int(info.get("batch_offset", 0))

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
