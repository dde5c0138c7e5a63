"""What the rest of the package needs of a pipeline's source: :class:`Source`.

The runner loads a streaming DataFrame from it and checks it first, the operations tools
read ranges and metadata with the options it gives them, and a few places ask whether it
reads an archive before Kafka. :class:`~inorder.kafka.api.KafkaSource` implements it, and so
does :class:`~inorder.archive.tiered_source.TieredSource` (the archive up to its end, then
Kafka).

The protocol lives here, in ``kafka/``, because the types it names (the parsed
:class:`~inorder.kafka.options.SourceOptions`, the metadata client) are this room's: every
room above it (``pipeline/``, ``ops/``, ``archive/``) depends on the protocol and never on
which source implements it, and ``kafka/`` never imports ``archive/``.

:class:`RangeReader` is the same inversion for the operations tools' reads: the options a
tiered source gives them read through the archive themselves; plain Kafka options are read
by :class:`KafkaReader`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from inorder.kafka.options import SourceOptions
from inorder.records import TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa

    from inorder.kafka.admin import KafkaAdmin

__all__ = ["KafkaReader", "RangeReader", "Source", "range_reader"]


@runtime_checkable
class Source(Protocol):
    """A pipeline's source, as the runner, the archiver and the operations tools use it."""

    def to_options(self) -> dict[str, str]:
        """The Kafka source's options by their Spark names (subscription, broker, clients)."""
        ...

    def check(
        self, extra_options: Mapping[str, str] | None = None, *, bounded: bool = False
    ) -> list[str]:
        """Validate and reach what the source reads (``ConfigError``); notes for the user."""
        ...

    def load(self, spark: Any, extra_options: Mapping[str, str] | None = None) -> Any:
        """The streaming DataFrame (Kafka's columns)."""
        ...

    @property
    def reads_archive(self) -> bool:
        """Whether records below an archive's end are read from the archive first."""
        ...

    def read_options(self) -> SourceOptions:
        """The parsed options the operations tools read ranges and metadata with.

        Pass them to :func:`range_reader`: a tiered source's read through its archive.
        """
        ...


@runtime_checkable
class RangeReader(Protocol):
    """How the operations tools read one topic-partition's records and the metadata."""

    def admin(self) -> KafkaAdmin:
        """The metadata client (topic-partitions, watermarks, offsets for times)."""
        ...

    def read_records(self, tp: TopicPartition, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Records of ``tp`` with offsets in ``[start, end)``, in offset order, no marker."""
        ...


class KafkaReader:
    """:class:`RangeReader` of plain Kafka options: the broker's records and metadata."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def admin(self) -> KafkaAdmin:
        """Kafka's metadata client."""
        from inorder.kafka.admin import KafkaAdmin

        return KafkaAdmin(self.options)

    def read_records(self, tp: TopicPartition, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Records of ``tp`` in ``[start, end)`` from Kafka."""
        from inorder.kafka.consumer import read_range

        return read_range(self.options, tp, start, end, markers=False)


def range_reader(options: SourceOptions) -> RangeReader:
    """The reader of ``options``: themselves when they read through an archive, else Kafka's."""
    if isinstance(options, RangeReader):
        return options
    return KafkaReader(options)
