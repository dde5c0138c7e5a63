"""What ``inorder verify`` reads from an output: batch commits, live files, and problems found.

Collected by :mod:`inorder.ops.verify_parquet` and :mod:`inorder.ops.verify_tables`, judged
by :mod:`inorder.ops.verify`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inorder.storage import fs as sfs


@dataclass(frozen=True)
class Problem:
    """One thing the proof does not hold for."""

    kind: str
    """``gap``, ``overlap``, ``committed_twice``, ``missing_file``, ``row_count``,
    ``digest``, ``shared_file``, ``uncommitted_visible``, ``unreadable``..."""
    detail: str
    batch: int | None = None
    partition: str | None = None
    file: str | None = None

    def line(self) -> str:
        """One human line: ``PROBLEM kind batch B partition T/P file F: detail``."""
        where = [f"batch {self.batch}" if self.batch is not None else ""]
        where += [f"partition {self.partition}" if self.partition else ""]
        where += [f"file {self.file}" if self.file else ""]
        place = " ".join(w for w in where if w)
        return f"PROBLEM {self.kind:<19} {place + ': ' if place else ''}{self.detail}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return {
            "kind": self.kind,
            "batch": self.batch,
            "partition": self.partition,
            "file": self.file,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class FileProof:
    """A file as a commit recorded it."""

    path: str
    """Relative to the output's root."""
    rows: int
    digest: str | None
    batch: int | None = None
    """The batch that added it (``None``: a compaction's or a repair's file)."""


@dataclass
class BatchProof:
    """What one batch commit recorded."""

    batch_id: int
    offsets: dict[str, tuple[int, int]] | None
    """``[start, end)`` per ``"<topic>/<partition>"``; ``None``: the commit recorded none."""
    files: list[FileProof] = field(default_factory=list)
    files_recorded: bool = True
    """Whether the commit recorded its files (commits of older releases did not)."""


@dataclass
class Evidence:
    """Everything a backend read from an output's metadata."""

    kind: str
    describe: str
    location: sfs.Location
    batches: list[BatchProof]
    """Batch commits in commit order (folded ones excluded)."""
    live: list[FileProof]
    """The files readers of the documented layout read now."""
    folded: dict[str, list[list[int]]] = field(default_factory=dict)
    """Ranges of batches folded into a commit checkpoint, before :attr:`batches`."""
    folded_upto: int | None = None
    folded_batches: int = 0
    """How many batch ids the commit checkpoint records."""
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
