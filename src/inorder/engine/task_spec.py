"""What one task of the partition backend is given: :class:`TaskSpec`, pickled per batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from inorder.codecs.base import Codec
from inorder.integrity import Integrity
from inorder.kafka.options import SourceOptions
from inorder.processor import Processor
from inorder.sinks.base import Sink
from inorder.state.checkpoint import CheckpointStore
from inorder.state.store import StateOptions


@dataclass(slots=True)
class TaskSpec:
    """Everything a task needs; pickled once per batch and sent to executors."""

    processor: Processor[Any, Any, Any]
    codec: Codec[Any]
    integrity: Integrity
    checkpoint: CheckpointStore
    sink: Sink
    output_schema: pa.Schema
    out_type: Any
    state_type: Any
    epoch: str
    batch_id: int
    processing_us: int
    dead_letter_sink: Sink | None = None
    state_options: StateOptions = field(default_factory=StateOptions)
    max_events: int = 100
    #: Set when the source only plans (``inorder.rangesOnly``): each marker row's range is
    #: read from Kafka here, by the task that applies it.
    source_options: SourceOptions | None = None
    #: The driver's :class:`~inorder.pipeline.live_progress.LiveProgress` address: where the
    #: task reports records applied while it runs (``None``: nowhere).
    progress_to: tuple[str, int] | None = None
