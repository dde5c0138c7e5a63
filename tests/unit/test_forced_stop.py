"""A second stop signal says what the forced stop costs: which batch runs again, or nothing.

Before: the second Ctrl-C ended the run with only "inorder: interrupted", leaving the operator
to guess whether work was lost; and a second signal arriving while the first one's note was
printed was taken for a first one, so the run kept waiting for its batch.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.e2e.cli_jobs import CountRaw

from inorder import KafkaSource, ParquetSink, Pipeline
from inorder.pipeline.runner import PipelineRunner


class _Notes:
    """A progress reporter that keeps the notes; ``on_note`` runs inside the first one."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.on_note: list[signal.Signals] = []

    def info(self, text: str) -> None:
        self.lines.append(text)
        while self.on_note:  # a signal that lands while the note is being printed
            signal.raise_signal(self.on_note.pop())

    def batch(self, progress: object) -> None:
        """Not used here."""

    def summary(self, summary: object) -> None:
        """Not used here."""


def _runner(tmp_path: Path, notes: _Notes) -> PipelineRunner:
    pipeline = Pipeline(
        source=KafkaSource(bootstrap_servers="127.0.0.1:1", topics=["t"]),
        processor=CountRaw(),
        sink=ParquetSink(str(tmp_path / "out")),
        checkpoint=str(tmp_path / "ck"),
    )
    return PipelineRunner(pipeline, reporter=notes)  # type: ignore[arg-type]


def test_a_forced_stop_names_the_running_batch(tmp_path: Path) -> None:
    notes = _Notes()
    runner = _runner(tmp_path, notes)
    restore = runner._install_signal_handlers()
    try:
        signal.raise_signal(signal.SIGTERM)
        runner._running = (7, 0.0)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        restore()
    assert notes.lines == [
        "inorder: SIGTERM received: stopping after the current batch (again to force)",
        "inorder: forced stop: batch 7 did not finish and will be re-run by the next start "
        "(its output is still written once)",
    ]


def test_a_forced_stop_between_batches_loses_nothing(tmp_path: Path) -> None:
    notes = _Notes()
    runner = _runner(tmp_path, notes)
    notes.on_note.append(signal.SIGINT)  # the second signal comes while the first is noted
    restore = runner._install_signal_handlers()
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        restore()
    assert notes.lines[-1] == "inorder: forced stop: no batch was running: nothing is lost"
