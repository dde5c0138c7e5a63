"""What the status page shows, gathered read-only from a pipeline's checkpoint, its output,
its batch history and (when reachable) the broker.

Reading state sizes and the output costs more than reading the batch log, so those parts are
computed again only when a new batch has committed; the broker's end offsets are asked for
at most every :data:`BROKER_EVERY` seconds, with a short timeout.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from inorder.checkpoint.layout import CheckpointLayout
from inorder.ops.batchlog import load_batch_log
from inorder.ops.inspect import PartitionStateInfo, batches, run_started_at, state_sizes
from inorder.ops.target import OpsTarget
from inorder.pipeline.batch_history import BatchHistory, read_history
from inorder.records import TopicPartition
from inorder.redaction import mask_secrets
from inorder.ui.output import RESETS_SHOWN, OutputInfo, read_output
from inorder.ui.rows import (
    batch_rows,
    events_by_partition,
    integrity_events,
    partition_rows,
)

#: Batches shown in the history charts and table (the newest ones).
BATCHES_SHOWN = 200
#: Seconds between two questions to the broker.
BROKER_EVERY = 5.0
#: Seconds the broker has to answer.
BROKER_TIMEOUT_MS = 2000
#: Topic-partitions whose state the page opens at each new batch (keys, state bytes);
#: beyond, each is sized from the checkpoint's file listing (its keys unknown, ``loaded``
#: false): opening 1,000 partitions' state took seconds of a core every batch.
STATE_LOADED = 100


def _version() -> str:
    from inorder import __version__

    return __version__


def _running(layout: CheckpointLayout) -> bool | None:
    """Whether a run holds the checkpoint's lock now (``None``: cannot tell from here).

    Never by taking the lock: a probe holding it, however briefly, could make a starting
    run refuse the checkpoint. Linux lists held locks in ``/proc/locks`` by device and
    inode; elsewhere the lock file's ``pid N on HOST`` line and whether that process lives
    must do (a process that ran a pipeline and lives on then counts as running).
    """
    path = layout.run_lock_file
    if path is None:
        return None
    try:
        info = os.stat(path)
        with open(path, encoding="utf-8") as handle:
            words = handle.read().split()
    except OSError:
        return False
    held = _held_locks()
    if held is not None:
        return (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino) in held
    if len(words) < 4 or words[0] != "pid" or not words[1].isdigit():
        return False
    if words[3] != socket.gethostname():
        return None
    try:
        os.kill(int(words[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _held_locks() -> set[tuple[int, int, int]] | None:
    """(major, minor, inode) of every file lock held on this machine (``None``: unknown)."""
    try:
        with open("/proc/locks", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    held = set()
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:123456 0 EOF"; waiting locks start with "->".
        if len(fields) < 6 or fields[1] == "->":
            continue
        parts = fields[5].split(":")
        if len(parts) == 3:
            try:
                held.add((int(parts[0], 16), int(parts[1], 16), int(parts[2])))
            except ValueError:
                continue
    return held


def _config(reference: str, target: OpsTarget) -> dict[str, Any]:
    """The pipeline's settings with every secret-named value masked."""
    info = target.layout.info()
    recorded = (info.settings if info is not None else None) or {}
    if reference.endswith(".toml"):
        from inorder.pipeline.config import load_toml

        config: dict[str, Any] = dict(load_toml(reference))
    else:
        p = target.pipeline
        config = {
            "pipeline": {
                "name": p.name,
                "checkpoint": str(p.checkpoint),
                "trigger": p.trigger,
                "backend": p.backend,
            },
            "source": dict(p.source.to_options()),
            "processor": {"type": type(p.processor).__qualname__},
            "sink": {"describe": target.sink.describe()},
        }
    if recorded.get("overrides"):
        config["last run --set"] = recorded["overrides"]
    masked: dict[str, Any] = mask_secrets(config)
    return masked


class StatusSource:
    """The status of one pipeline, recomputed on demand (thread-safe)."""

    def __init__(
        self,
        reference: str,
        target: OpsTarget,
        history: BatchHistory | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reference = reference
        self.target = target
        self.history = history
        self._clock = clock
        self._lock = threading.Lock()
        self._committed_key: object = ()
        self._state: list[PartitionStateInfo] = []
        self._output = OutputInfo("", "")
        self._broker_at = 0.0
        self._ends: dict[TopicPartition, int] | None = None
        self._broker_note = ""
        self._config: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        """The pipeline's name."""
        return str(self.target.pipeline.name)

    def _refresh_committed(self, key: object, log: Any) -> None:
        if key == self._committed_key:
            return
        self._broker_at = 0.0  # a new batch: end offsets older than it would look stale
        self._state = state_sizes(self.target, log, load=None, load_max=STATE_LOADED)
        self._output = self._read_output()
        self._committed_key = key

    def _read_output(self) -> OutputInfo:
        return read_output(self.target.sink, self.reference, self.target.batch_offset)

    def _broker(self, tps: list[TopicPartition]) -> None:
        now = self._clock()
        if now - self._broker_at < BROKER_EVERY:
            return
        self._broker_at = now
        from inorder.ops.kafka_reads import partitions, watermarks

        try:
            options = replace(self.target.source_options, metadata_timeout_ms=BROKER_TIMEOUT_MS)
            known = sorted(set(tps) | set(partitions(options)))
            self._ends = {tp: w.high for tp, w in watermarks(options, known).items()}
            self._broker_note = ""
        except Exception as exc:  # the page works from the checkpoint alone
            self._ends = None
            self._broker_note = f"broker not reachable ({type(exc).__name__})"

    def status(self) -> dict[str, Any]:
        """The whole page's content as a JSON-ready document."""
        with self._lock:
            return self._status()

    def _status(self) -> dict[str, Any]:
        target = self.target
        running = _running(target.layout)
        # The history before the log: a run records a batch's line after Spark's commit, so
        # every line read here belongs to a batch the log (read next) shows committed.
        recent = list(self.history.recent) if self.history is not None else None
        history = read_history(target.layout, recent)
        log = load_batch_log(target.layout, target.engine)
        last = log.last_committed()
        self._refresh_committed(
            (None, None) if last is None else (last.batch_id, last.committed_at), log
        )
        self._broker(log.partitions())
        if self._config is None:
            self._config = _config(self.reference, target)
        infos = batches(log, None, history, run_started_at(target.layout))
        events = integrity_events(self.reference, infos, history)
        spark_lag = None
        if history:
            spark_lag = history[max(history)].get("lag_by_partition")
        partitions = partition_rows(
            log, infos, self._ends, spark_lag, self._state, events_by_partition(events)
        )
        resets = events_by_partition(self._output.resets)
        ignored: dict[str, int] = {}
        for line in (history or {}).values():
            for name, n in (line.get("ignored_by_partition") or {}).items():
                ignored[name] = ignored.get(name, 0) + int(n)
        for row in partitions:
            row.resets = resets.get(TopicPartition(row.topic, row.partition), 0)
            row.ignored = ignored.get(f"{row.topic}[{row.partition}]", 0)
        shown = infos[-BATCHES_SHOWN:]
        output = self._output
        return {
            "pipeline": self.name,
            "reference": self.reference,
            "version": _version(),
            "checkpoint": target.checkpoint_root,
            "generated_at": self._clock(),
            "running": running,
            "last_committed_batch": None if last is None else last.batch_id,
            "batches_in_log": len(log.batches),
            "batch_offset": target.batch_offset,
            "broker": self._broker_note or "reachable",
            "partitions": [asdict(p) for p in partitions],
            "batches": [
                asdict(b)
                for b in batch_rows(
                    shown, history, output.by_batch, target.batch_offset, running
                )
            ],
            "history_recorded": bool(history),
            # The run's own count at its newest batch: known whether the state was opened.
            "state_keys": (history[max(history)].get("state_keys") if history else None),
            "events": [asdict(e) for e in events[:RESETS_SHOWN]],
            "resets": [asdict(e) for e in output.resets],
            "state": [asdict(s) for s in self._state],
            "output": {k: v for k, v in asdict(output).items() if k not in ("by_batch", "resets")},
            "config": self._config,
        }  # fmt: skip
