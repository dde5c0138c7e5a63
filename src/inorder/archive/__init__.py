"""Infinite retention: a raw Kafka archive, a tiered (archive, then Kafka) source, initial state.

* :class:`Archive` lands every Kafka record exactly once in a partitioned Parquet dataset.
* :class:`TieredSource` (what ``KafkaSource(..., archive=path)`` becomes in a ``Pipeline``;
  the ``inorder-tiered`` data source) reads each topic-partition from the archive up to its
  end, then from Kafka, with an exact seam.
* :class:`InitialState` starts a new pipeline checkpoint from a table of keys and states.
"""

from inorder.archive.archiver import Archive, ArchiveBatchReport, ArchiveSummary
from inorder.archive.coverage import ArchiveError, Coverage, load_coverage
from inorder.archive.initial_state import InitialState
from inorder.archive.tiered_source import TieredSource

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
