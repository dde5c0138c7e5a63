"""What the file-based sinks (Parquet, Delta) share: a root path, partitioning, compression.

The location is resolved lazily on the side that uses it (driver or executor) and never
pickled: credentials and clients stay where they were made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

import pyarrow as pa

from inorder.sinks.base import Sink, SinkError
from inorder.sinks.parquet_writer import COMPRESSIONS
from inorder.storage import fs as sfs


class FileSink(Sink):
    """What the Parquet and Delta sinks share: files under ``path`` (local or S3), partitioned
    by ``partition_by``, compressed with ``compression``, reached with ``storage_options``.

    The location is resolved on first use and never pickled: each executor resolves its own.
    """

    def __init__(
        self,
        path: str,
        partition_by: Sequence[str],
        compression: str,
        storage_options: Mapping[str, str] | None,
    ) -> None:
        if compression.lower() not in COMPRESSIONS:
            raise SinkError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        self.path = str(path)
        self.partition_by = list(partition_by)
        self.compression = compression.lower()
        self.storage_options = dict(storage_options) if storage_options else None
        self._location: sfs.Location | None = None
        self._schema: pa.Schema | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, partition_by={self.partition_by!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_location"] = None  # re-resolved on the executor
        return state

    @property
    def location(self) -> sfs.Location:
        """The resolved root (filesystem + path)."""
        if self._location is None:
            self._location = sfs.resolve(self.path, self.storage_options)
        return self._location

    def beside(self, suffix: str, partition_by: Sequence[str]) -> Self:
        """A sink of this kind at ``path + suffix``, compressed and stored like this one."""
        return type(self)(
            self.path.rstrip("/") + suffix,
            partition_by,
            compression=self.compression,
            storage_options=self.storage_options,
        )


__all__ = ["FileSink"]
