"""The driver's view of a running batch: records applied so far, as its tasks report them.

Tasks of the partition backend send their running counts (:mod:`inorder.engine.beacon`) to a
UDP socket that :class:`LiveProgress` opens on the driver's address (loopback for a local
master, ``spark.driver.host`` on a cluster, which executors reach anyway). A thread keeps,
per batch, the largest count seen for each topic-partition; the runner's status line reads
the batch's total with :meth:`LiveProgress.applied`. Counts only ever grow, so a datagram
lost or reordered leaves the display a moment behind, never wrong by more than that; a task
attempt that is retried may count records twice until the batch ends, and the batch's own
line (from the tasks' results) is what is exact.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from typing import Any


class LiveProgress:
    """Receives the tasks' applied-record counts for the batches of one run."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((host, 0))
        self._lock = threading.Lock()
        self._counts: dict[int, dict[tuple[str, int], int]] = {}
        self._closed = False
        #: The host tasks send to, when it is not the bound address (see :meth:`on_driver`).
        self.advertised: str | None = None
        self._thread = threading.Thread(target=self._receive, name="inorder-live-progress")
        self._thread.daemon = True
        self._thread.start()

    @classmethod
    def on_driver(cls, spark: Any) -> LiveProgress | None:
        """A receiver on the address the session's driver binds (``None`` if it cannot bind:
        the run goes on without live counts)."""
        conf = spark.sparkContext.getConf()
        host = conf.get("spark.driver.bindAddress") or conf.get("spark.driver.host")
        try:
            receiver = cls(host or "127.0.0.1")
        except OSError:
            return None
        # Executors reach the driver at its advertised host, which may differ from the bind.
        receiver.advertised = conf.get("spark.driver.host") or receiver.address[0]
        return receiver

    @property
    def address(self) -> tuple[str, int]:
        """Where tasks send their counts (host, port)."""
        host, port = self._socket.getsockname()[:2]
        return self.advertised or str(host), int(port)

    def applied(self, batch_id: int) -> int | None:
        """Records applied so far in ``batch_id``; ``None`` before any task reported."""
        with self._lock:
            counts = self._counts.get(batch_id)
            return None if counts is None else sum(counts.values())

    def forget(self, batch_id: int) -> None:
        """Drop a finished batch's counts (and any older batch's)."""
        with self._lock:
            for old in [b for b in self._counts if b <= batch_id]:
                del self._counts[old]

    def close(self) -> None:
        """Stop receiving (the thread ends when the socket closes)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._thread.join(timeout=5)

    def _receive(self) -> None:
        while not self._closed:
            try:
                payload = self._socket.recv(65_536)
            except OSError:
                return
            if not payload:
                continue
            self._record(payload)

    def _record(self, payload: bytes) -> None:
        try:
            message: Any = json.loads(payload)
            batch_id = int(message["batch"])
            applied = [(str(t), int(p), int(n)) for t, p, n in message["applied"]]
        except (ValueError, KeyError, TypeError):
            return  # not ours, or damaged: a display aid ignores it
        with self._lock:
            counts = self._counts.setdefault(batch_id, {})
            for topic, partition, n in applied:
                key = (topic, partition)
                if n > counts.get(key, 0):
                    counts[key] = n
