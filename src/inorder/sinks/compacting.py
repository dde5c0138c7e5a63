"""What a table sink that merges its small files after its commits shares (Delta, Iceberg).

The compactor is built when first needed (a sink that never compacts builds none); the run's
lease check, handed over before that (:meth:`Compacting.guard_background`), goes to it; the
run finishes its pending round before giving the lease up. The compactor is a
:class:`~inorder.sinks.parquet_compactor.ParquetCompactor` whose rounds run the table
format's merges (:mod:`inorder.sinks.delta_compaction`, :mod:`inorder.sinks.iceberg_compaction`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from inorder.sinks.parquet_compactor import ParquetCompactor


class Compacting:
    """Mixin of a sink with ``compact``: its compactor, fenced and finished by the run."""

    compact: bool = False
    _compactor: ParquetCompactor | None = None
    _lease_check: Callable[[], None] | None = None

    def _make_compactor(self) -> ParquetCompactor:
        """The compactor of this sink's table format, with the sink's settings."""
        raise NotImplementedError

    @property
    def compactor(self) -> ParquetCompactor:
        """What merges small files after each commit (``compact=True``)."""
        if self._compactor is None:
            self._compactor = self._make_compactor()
            self._compactor.guard = self._lease_check
        return self._compactor

    def guard_background(self, check: Callable[[], None]) -> None:
        """Run ``check`` (the lease's) before each merge's commit point."""
        self._lease_check = check
        if self._compactor is not None:
            self._compactor.guard = check

    def finish_background(self, timeout: float | None = None) -> str | None:
        """Let the compactor thread finish its pending round and stop."""
        return None if self._compactor is None else self._compactor.finish(timeout)

    def _after_commit(self, partitions: Collection[str] | None) -> None:
        """A batch committed (writing to ``partitions``; ``None``: unknown): merge."""
        if self.compact:
            self.compactor.after_commit(partitions)

    @staticmethod
    def _unshipped(state: dict[str, object]) -> dict[str, object]:
        """``state`` for pickling: a driver thread and the lease are never shipped."""
        state["_compactor"] = state["_lease_check"] = None
        return state


__all__ = ["Compacting"]
