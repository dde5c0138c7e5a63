"""Fixtures of the fault-injection suite: the ``matrix`` recorder."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults.matrix import FaultRow, write_rows


class MatrixRecorder:
    """Collects a test's rows; they are written when the test ends (passed or failed)."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.rows: list[FaultRow] = []
        self._started = time.monotonic()

    def record(self, **fields: Any) -> FaultRow:
        """Add a row (the fields of :class:`FaultRow` but ``test``)."""
        row = FaultRow(test=self.test, seconds=round(time.monotonic() - self._started, 1), **fields)
        self.rows.append(row)
        return row


@pytest.fixture
def matrix(request: pytest.FixtureRequest) -> Iterator[MatrixRecorder]:
    """Record this test's fault-matrix rows (see ``tests/faults/matrix.py``)."""
    recorder = MatrixRecorder(request.node.nodeid)
    yield recorder
    if recorder.rows:
        write_rows(request.node.nodeid, recorder.rows)
