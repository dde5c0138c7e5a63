"""What the operations tools work on: a loaded pipeline and the paths of its checkpoint.

A pipeline's checkpoint root holds two independent logs (see
:mod:`inorder.pipeline.runner`): ``<checkpoint>/spark`` (Spark's offsets and commits logs:
which offsets each micro-batch covered) and ``<checkpoint>/engine`` (inorder's versioned
per-partition state and the processing time of each batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from inorder.codecs.base import Codec
from inorder.integrity import Integrity
from inorder.kafka.options import SourceOptions, parse_options
from inorder.processor import Processor, ProcessorTypes, processor_types
from inorder.sinks.base import Sink
from inorder.state.checkpoint import CheckpointStore


@dataclass
class OpsTarget:
    """A pipeline seen by the operations tools (nothing is started by creating one)."""

    pipeline: Any

    @classmethod
    def load(cls, reference: str) -> OpsTarget:
        """Load a pipeline from a TOML file or ``module:attribute``."""
        from inorder.pipeline.config import load_pipeline

        return cls(load_pipeline(reference))

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
        """The Kafka source's parsed options (bootstrap servers, subscription, client settings)."""
        options = parse_options(self.pipeline.source.to_options())
        archive = getattr(self.pipeline.source, "archive", None)
        if archive:  # read through the archive, then Kafka, like the pipeline's source
            from inorder.archive.tiered_source import tiered_options_of

            storage = getattr(self.pipeline.source, "archive_storage_options", None)
            return tiered_options_of(options, archive, storage)
        return options

    @property
    def checkpoint_root(self) -> str:
        """The checkpoint root (no trailing slash)."""
        return str(self.pipeline.checkpoint).rstrip("/")

    @property
    def spark_dir(self) -> str:
        """Spark's checkpoint directory (offsets and commits logs)."""
        return f"{self.checkpoint_root}/spark"

    @cached_property
    def batch_offset(self) -> int:
        """What ``inorder repair`` added to this checkpoint's batch ids in the output (0 if none).

        After a repair the new checkpoint's batch ``b`` is the output's batch
        ``batch_offset + b`` (see :mod:`inorder.sinks.offset_ids`).
        """
        import json

        from inorder.pipeline.query import CHECKPOINT_FILE
        from inorder.sinks import fs as sfs

        location = sfs.resolve(self.checkpoint_root)
        path = location.join(CHECKPOINT_FILE)
        if not sfs.exists(location, path):
            return 0
        info: dict[str, Any] = json.loads(sfs.read_bytes(location, path))
        return int(info.get("batch_offset", 0))

    @cached_property
    def engine(self) -> CheckpointStore:
        """inorder's state checkpoint."""
        return CheckpointStore(f"{self.checkpoint_root}/engine")
