"""Committed batch ids of a dataset, kept as ranges (a long history costs a few numbers)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import overload


class BatchIds(Sequence[int]):
    """Committed batch ids kept as inclusive ranges: a long history costs a few numbers."""

    def __init__(self, ranges: Sequence[Sequence[int]] = ()) -> None:
        self._ranges: list[list[int]] = []
        for lo, hi in ranges:
            self._extend(int(lo), int(hi))

    def _extend(self, lo: int, hi: int) -> None:
        if self._ranges and lo <= self._ranges[-1][1] + 1:
            self._ranges[-1][1] = max(self._ranges[-1][1], hi)
        else:
            self._ranges.append([lo, hi])

    def append(self, batch_id: int) -> None:
        """Add ``batch_id`` (ids are added in increasing order)."""
        self._extend(batch_id, batch_id)

    def ranges(self) -> list[list[int]]:
        """The ids as ``[first, last]`` inclusive ranges, in order."""
        return [list(r) for r in self._ranges]

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self._ranges)

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self._ranges:
            yield from range(lo, hi + 1)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        i = bisect.bisect_right([lo for lo, _ in self._ranges], value) - 1
        return i >= 0 and value <= self._ranges[i][1]

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += len(self)
        if index < 0:
            raise IndexError(index)
        for lo, hi in self._ranges:
            if index <= hi - lo:
                return lo + index
            index -= hi - lo + 1
        raise IndexError(index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchIds):
            return self._ranges == other._ranges
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"BatchIds({self._ranges!r})"


__all__ = ["BatchIds"]
