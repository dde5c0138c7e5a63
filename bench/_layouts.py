"""Output layouts of ``bench/small_files.py`` and what it samples of its processes.

``--layouts topic,bucket``: ``topic`` is the documented per-site layout, ``partition_by =
["topic"]`` (one directory, and one file per batch, per topic); ``bucket`` is ``partition_by
= ["topic_bucket"]`` with ``--buckets`` buckets (default 32), the column the Parquet sink
derives from the topic (docs/small-files.md, "Layout for 1,000 topics at a 5 s trigger").

:class:`RssSampler` samples every 0.2 s the resident memory of the bench's process (the
driver and the producer) and of its descendants but the broker (the JVM and the Python
workers), and their CPU seconds (user + system, from the sampler's start; a process's last
sample counts once it is gone). :func:`wrap_compaction` times the sink's compaction calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

LAYOUTS = ("topic", "bucket")


def apply_layout(config: dict[str, Any], layout: str, buckets: int) -> None:
    """Set the ``[sink]`` partitioning of a validated pipeline config for ``layout``."""
    if layout not in LAYOUTS:
        raise SystemExit(f"--layouts: unknown layout {layout!r} (one of {', '.join(LAYOUTS)})")
    if layout == "bucket":
        config["sink"]["partition_by"] = ["topic_bucket"]
        config["sink"]["topic_buckets"] = buckets
    else:
        config["sink"]["partition_by"] = ["topic"]


def describe(layouts: list[str], buckets: int) -> str:
    """The layouts of a run as words for the docs."""
    words = {"topic": "by topic", "bucket": f"by `topic_bucket` ({buckets} buckets)"}
    return "output partitioned " + " or ".join(words[x] for x in layouts)


class RssSampler(threading.Thread):
    """Peak RSS and CPU seconds of this process and of its descendants but the broker."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.driver = 0
        self.children = 0
        self.timeline: list[tuple[float, int, int]] = []
        self._cpu: dict[int, tuple[bool, float]] = {}
        """Per pid: (is this process, CPU seconds at its last sample)."""
        self._stop_event = threading.Event()

    @property
    def cpu_driver(self) -> float:
        """CPU seconds of this process (driver and producer) while sampled."""
        return sum(s for me, s in self._cpu.values() if me)

    @property
    def cpu_children(self) -> float:
        """CPU seconds of the JVM and the Python workers while sampled."""
        return sum(s for me, s in self._cpu.values() if not me)

    def run(self) -> None:
        """Sample until :meth:`stop`."""
        import psutil

        me = psutil.Process()
        start = _cpu(me)
        # A JVM kept from an earlier run counts from here, not from its start.
        base: dict[int, float] = {}
        for child in me.children(recursive=True):
            try:
                base[child.pid] = _cpu(child)
            except psutil.Error:
                continue
        while not self._stop_event.wait(0.2):
            try:
                rss = me.memory_info().rss
                self.driver = max(self.driver, rss)
                self._cpu[me.pid] = (True, _cpu(me) - start)
                total = 0
                for child in me.children(recursive=True):
                    try:
                        if "noida" not in child.name():  # the broker holds every message
                            total += child.memory_info().rss
                            used = _cpu(child) - base.get(child.pid, 0.0)
                            self._cpu[child.pid] = (False, used)
                    except psutil.Error:
                        continue  # a worker that exited between listing and reading
                self.children = max(self.children, total)
                self.timeline.append((time.time(), rss, total))
            except psutil.Error:
                continue

    def stop(self) -> None:
        """End sampling."""
        self._stop_event.set()
        self.join(5)


def _cpu(process: Any) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def wrap_compaction(fmt: str, timed: Callable[[float], None]) -> Callable[[], None]:
    """Time every call of the sink's compaction; returns the undo function.

    The sinks import the function from its module at call time, so patching the module
    attribute reaches them.
    """
    from inorder.sinks import compaction, delta_compaction

    module: Any = delta_compaction if fmt == "delta" else compaction
    name = "compact_delta_levels" if fmt == "delta" else "compact_parquet"
    original = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timed(time.perf_counter() - started)

    setattr(module, name, wrapper)
    return lambda: setattr(module, name, original)
