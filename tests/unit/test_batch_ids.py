"""BatchIds: committed batch ids kept as ranges (commit checkpoints of the Parquet sink)."""

from __future__ import annotations

import pytest

from inorder.sinks.parquet import BatchIds


def test_ranges_merge_and_behave_like_a_sorted_list() -> None:
    ids = BatchIds([[0, 3], [4, 4], [7, 9]])
    ids.append(10)
    ids.append(12)
    expected = [0, 1, 2, 3, 4, 7, 8, 9, 10, 12]
    assert ids.ranges() == [[0, 4], [7, 10], [12, 12]]
    assert list(ids) == expected and ids == expected
    assert len(ids) == len(expected)
    assert [ids[i] for i in range(len(expected))] == expected
    assert ids[-1] == 12 and ids[1:3] == [1, 2]
    assert all(i in ids for i in expected)
    assert not any(i in ids for i in (-1, 5, 6, 11, 13))
    with pytest.raises(IndexError):
        ids[len(expected)]


def test_empty() -> None:
    ids = BatchIds()
    assert len(ids) == 0 and list(ids) == [] and 0 not in ids and ids.ranges() == []
