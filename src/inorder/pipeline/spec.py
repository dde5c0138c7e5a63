"""What a pipeline is: source, codec, processor, integrity, sink and checkpoint, as values.

:class:`PipelineSpec` holds the settings and what follows from them alone (the codec and
integrity in force, the default dead letters); :class:`~inorder.pipeline.pipeline.Pipeline`
adds running it. The runner works from a spec, so it never imports the class that runs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Literal

from inorder.checkpoint.layout import CheckpointLayout
from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.processor import Msg, Out, Processor, State
from inorder.sinks.base import Sink

if TYPE_CHECKING:
    from inorder.archive.initial_state import InitialState
    from inorder.codecs.base import Codec
    from inorder.kafka.api import KafkaSource
    from inorder.pipeline.observer import RunObserver
    from inorder.sessions.tables_writer import TableOutputs

Backend = Literal["partition", "spark"]
BACKENDS: tuple[str, ...] = ("partition", "spark")
#: How the default dead-letter output is named beside the output.
DEAD_LETTER_SUFFIX = "_dead_letter"
DEAD_LETTER_PARTITION_BY = ("topic",)


@dataclass
class PipelineSpec(Generic[Msg, State, Out]):
    """A pipeline's settings, and what follows from them alone (see
    :class:`~inorder.pipeline.pipeline.Pipeline`, which adds running it)."""

    source: KafkaSource
    processor: Processor[Msg, State, Out]
    sink: Sink
    checkpoint: str | Path
    codec: Codec[Msg] | None = None
    integrity: Integrity | None = None
    trigger: str = "10 seconds"
    backend: Backend = "partition"
    dead_letter: Sink | None = None
    name: str = "inorder"
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    progress: str = "auto"
    tick_interval: timedelta | None = None
    observers: Sequence[RunObserver] = ()
    job_version: str | None = None
    initial_state: InitialState | None = None
    materialized: Sink | None = None
    materialize_every: int | None = None
    tables: TableOutputs | None = None
    #: How long the driver's hold on the checkpoint lasts without renewal (default 30 s).
    lease_duration: timedelta | None = None
    #: ``inorder run``'s exit code when the policy set data aside (dead-lettered, reset or
    #: ignored records) in a run that otherwise ended normally; 0 to treat that as success.
    set_aside_exit_code: int = 3
    #: Where the partition backend writes a batch's state deltas: ``"task"``, one file per
    #: task (state format 3: docs/state.md), or ``"partition"``, a file per topic-partition.
    state_deltas: str = "task"

    def __post_init__(self) -> None:
        if not isinstance(self.processor, Processor):
            raise ConfigError(
                f"processor: a {type(self.processor).__name__} is not an inorder.Processor "
                "(subclass Processor[Msg, State, Out])"
            )
        # Under the dead_letter policy records must land somewhere durable: by default in a
        # dataset of the output's kind beside it (not inside it, where a reader's glob of the
        # output would pick the dead letters up). A sink without a path gets none; the
        # runner then refuses to start.
        if self.dead_letter is None and self.dead_letters_possible():
            self.dead_letter = self.sink.beside(DEAD_LETTER_SUFFIX, DEAD_LETTER_PARTITION_BY)

    def checkpoint_layout(self) -> CheckpointLayout:
        """The layout of :attr:`checkpoint`: where a path given by the user becomes the
        typed layout that the runner and the tools hand down (each builds it once)."""
        return CheckpointLayout.of(self.checkpoint)

    def dead_letters_possible(self) -> bool:
        """Whether the integrity policy can dead-letter records."""
        try:
            return self.resolved_integrity().on_violation == "dead_letter"
        except Exception:  # a broken processor default: the runner's checks report it
            return False

    def resolved_codec(self) -> Codec[Msg]:
        """The codec to use: given, the processor's default, or JSON into its message type."""
        if self.codec is not None:
            return self.codec
        own = self.processor.default_codec()
        if own is not None:
            return own
        from inorder.codecs.json import JsonCodec
        from inorder.processor import processor_types

        msg_type = processor_types(self.processor).msg
        json_codec: Codec[Msg] = JsonCodec(msg_type)
        return json_codec

    def resolved_integrity(self) -> Integrity:
        """The integrity to enforce: given, the processor's default, or strict/fail."""
        if self.integrity is not None:
            return self.integrity
        return self.processor.default_integrity() or Integrity.strict()
