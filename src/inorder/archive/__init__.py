"""Infinite retention: a raw Kafka archive, a tiered (archive, then Kafka) source, initial state.

* :class:`~inorder.pipeline.archiver.Archive` lands every Kafka record exactly once in a
  partitioned Parquet dataset (each batch: :mod:`inorder.archive.writer`). It runs a streaming
  query as the pipelines' runner does, so it lives beside the runner; its name is still
  importable here, on first use, for code written against earlier releases.
* :class:`TieredSource` (what ``KafkaSource(..., archive=path)`` becomes in a ``Pipeline``;
  the ``inorder-tiered`` data source) reads each topic-partition from the archive up to its
  end, then from Kafka, with an exact seam.
* :class:`InitialState` starts a new pipeline checkpoint from a table of keys and states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inorder.archive.coverage import ArchiveError, Coverage, load_coverage
from inorder.archive.initial_state import InitialState
from inorder.archive.tiered_source import TieredSource
from inorder.archive.writer import ArchiveBatchReport

if TYPE_CHECKING:
    from inorder.pipeline.archiver import Archive, ArchiveSummary

# The job's names resolve on first use: the pipelines' runner imports this package's readers,
# and importing the job (the runner's own folder) from here at once would tie them together.
_JOB_NAMES = ("Archive", "ArchiveSummary")


def __getattr__(name: str) -> Any:
    if name not in _JOB_NAMES:
        raise AttributeError(f"module 'inorder.archive' has no attribute {name!r}")
    import inorder.pipeline.archiver as job

    value = getattr(job, name)
    globals()[name] = value
    return value


__all__ = [
    "Archive",
    "ArchiveBatchReport",
    "ArchiveError",
    "ArchiveSummary",
    "Coverage",
    "InitialState",
    "TieredSource",
    "load_coverage",
]
