"""The sink contract: executors write a micro-batch's files, the driver commits the batch once.

Exactly-once rests on two rules:

* A task writes only *staged* files that no reader treats as part of the dataset, and reports
  them as :class:`WrittenFile` descriptors (small; collected to the driver).
* :meth:`Sink.commit` publishes exactly the reported files of batch ``batch_id`` atomically and
  idempotently: committing a batch that is already committed changes nothing and returns
  ``False``. Files staged by failed attempts are never published and are cleaned up.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import pyarrow as pa

from inorder.errors import SinkError as SinkError

if TYPE_CHECKING:
    from inorder.storage.fs import Location


class DuplicateCommitError(SinkError):
    """A commit of a batch that the output already holds was about to be made.

    Raised at the commit point when the batch id is found committed there although the
    sink's idempotency check had not seen it (another driver with the same app id, a stale
    view): committing would add the batch's rows a second time.
    """


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """A staged file written by a task, waiting for its batch's commit."""

    path: str
    """Location of the staged file, relative to the sink's root."""
    rows: int
    size_bytes: int
    partition_values: dict[str, str | None] = field(default_factory=dict)
    stats: str | None = None
    """Optional column statistics as Delta ``add.stats`` JSON (numRecords, min/max, nulls)."""
    digest: str | None = None
    """The digest of the file's rows (:mod:`inorder.sinks.proof`), ``None`` if not computed."""


@dataclass(frozen=True, slots=True)
class ConsumedOffsets:
    """How far a micro-batch consumed one topic-partition (from its task's result)."""

    topic: str
    partition: int
    first_offset: int | None
    """First offset applied in the batch (``None``: no record in it)."""
    last_offset: int
    """Highest offset consumed up to and including the batch (-1: none yet)."""


class BatchWriter(abc.ABC):
    """Executor side: buffers Arrow data of one task and writes staged files."""

    @abc.abstractmethod
    def write(self, batch: pa.RecordBatch) -> None:
        """Add rows (schema as given to :meth:`Sink.open_writer`)."""

    @abc.abstractmethod
    def close(self) -> list[WrittenFile]:
        """Flush and return the staged files written."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Delete whatever this writer staged."""


class Sink(abc.ABC):
    """A destination for output rows. Instances are pickled to executors: keep them small."""

    @abc.abstractmethod
    def check(self, schema: pa.Schema) -> None:
        """Driver, before the first batch: fail with :class:`SinkError` if unusable."""

    @abc.abstractmethod
    def open_writer(self, schema: pa.Schema, batch_id: int, task_key: str) -> BatchWriter:
        """Executor: a writer for one task's rows of ``batch_id``.

        ``task_key`` is unique per task attempt (e.g. ``"<topic>-<partition>-<uuid>"``).
        """

    @abc.abstractmethod
    def commit(self, batch_id: int, files: Sequence[WrittenFile]) -> bool:
        """Driver: publish the batch; ``False`` when it was already committed (nothing done)."""

    def commit_consumed(
        self, batch_id: int, files: Sequence[WrittenFile], consumed: Sequence[ConsumedOffsets]
    ) -> bool:
        """Driver: :meth:`commit`, told how far the batch consumed each topic-partition.

        The backend calls this one. Sinks that record a batch's input offsets with its
        commit (Iceberg's snapshot summary) override it; by default it is :meth:`commit`.
        """
        return self.commit(batch_id, files)

    @abc.abstractmethod
    def is_committed(self, batch_id: int) -> bool:
        """Driver: whether ``batch_id`` has been committed."""

    def bind(self, owner: str) -> None:
        """Tie the sink to the pipeline checkpoint that writes it (called before ``check``).

        Batch ids restart at 0 with every new checkpoint, so a sink that took "batch N is
        committed" from another checkpoint's commits would skip new data. Sinks record the
        owner with each commit and refuse output committed by a different owner.
        """
        self._owner = owner

    @property
    def owner(self) -> str | None:
        """The pipeline checkpoint id given to :meth:`bind`, if any."""
        owner: str | None = getattr(self, "_owner", None)
        return owner

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for humans (no credentials)."""

    def guard_background(self, check: Callable[[], None]) -> None:
        """Driver: run ``check`` (the writer's lease check) before any commit the sink makes
        beside the stream (a compactor thread's merges). Nothing by default."""
        del check  # a sink with no such commits has nothing to guard

    def finish_background(self, timeout: float | None = None) -> str | None:
        """Driver, at the end of a run: finish work running beside the stream and stop it;
        the last error that work met, in one line (``None``: none). Nothing by default."""
        return None

    def beside(self, suffix: str, partition_by: Sequence[str]) -> Sink | None:
        """A sink of the same kind and storage at this one's path + ``suffix``.

        ``None`` for sinks without a path. Used for the default dead-letter output.
        """
        return None

    def read_batches(self, first: int, last: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Driver: the committed rows whose ``batch_id`` is in ``[first, last]``.

        ``columns`` selects columns (all when ``None``). Sinks that can be read back
        (Parquet, Delta) override this; others raise :class:`SinkError`.
        """
        raise SinkError(f"{self.describe()}: cannot be read back by batch")


@runtime_checkable
class StoredSink(Protocol):
    """A sink whose rows live in files at a storage location (Parquet, Delta).

    What the tools (validate, repair, inspect, compaction) need beyond :class:`Sink`: where
    the data is, and the newest committed batch.
    """

    @property
    def location(self) -> Location:
        """The resolved storage location of the dataset."""
        ...

    def last_committed_batch(self) -> int | None:
        """The newest committed batch id, ``None`` before the first commit."""
        ...


def stored(sink: Sink) -> StoredSink:
    """``sink`` as a :class:`StoredSink`; :class:`SinkError` for a sink without files."""
    if not isinstance(sink, StoredSink):
        raise SinkError(f"{sink.describe()}: only Parquet and Delta outputs can be read back")
    return sink
