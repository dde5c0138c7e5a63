"""The archive's job and its batches: their homes are :mod:`inorder.pipeline.archiver` (the
job, beside the pipelines' runner) and :mod:`inorder.archive.writer` (one batch's work), kept
importable here for code written against earlier releases."""

from __future__ import annotations

from inorder.archive.writer import (
    DEFAULT_TARGET_FILE_SIZE,
    ArchiveBatchReport,
    archive_sink,
    run_archive_batch,
    to_archive_batch,
)
from inorder.pipeline.archiver import Archive, ArchiveSummary

__all__ = [
    "DEFAULT_TARGET_FILE_SIZE",
    "Archive",
    "ArchiveBatchReport",
    "ArchiveSummary",
    "archive_sink",
    "run_archive_batch",
    "to_archive_batch",
]
