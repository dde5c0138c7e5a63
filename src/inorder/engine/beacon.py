"""Records applied so far, sent from a running task to the driver as it goes.

Spark reports a task's work only when the task ends, so a batch of one large backlog would
show nothing but elapsed time until it is done. A task of the partition backend therefore
sends, at most every :data:`INTERVAL` seconds and once at its end, one UDP datagram to the
driver with each of its topic-partitions' running count of applied records. Datagrams carry
totals, not increments, so one that is lost or arrives late costs nothing: the receiver
(:mod:`inorder.pipeline.live_progress`) keeps the largest count per topic-partition. It is a
display aid only: nothing about a batch's result or its commit depends on it, and a send
that fails is ignored.
"""

from __future__ import annotations

import json
import socket
import time

from inorder.records import TopicPartition

#: Seconds between datagrams of one task (the terminal refreshes about this often).
INTERVAL = 0.5
#: Stay well below the 64 KiB UDP limit: a task with many partitions sends several.
_MAX_DATAGRAM = 32_000


class ProgressBeacon:
    """Counts a task's applied records per topic-partition and sends them to ``address``."""

    def __init__(self, address: tuple[str, int] | None, batch_id: int) -> None:
        self._address = address
        self._batch_id = batch_id
        self._applied: dict[TopicPartition, int] = {}
        self._changed: set[TopicPartition] = set()
        self._next_send = 0.0
        self._socket: socket.socket | None = None

    def add(self, tp: TopicPartition, records: int) -> None:
        """Count ``records`` more applied records of ``tp``; send if the interval has passed."""
        if self._address is None or records <= 0:
            return
        self._applied[tp] = self._applied.get(tp, 0) + records
        self._changed.add(tp)
        now = time.monotonic()
        if now >= self._next_send:
            self._next_send = now + INTERVAL
            self._send()

    def close(self) -> None:
        """Send the final counts and release the socket."""
        if self._address is None:
            return
        self._send()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _send(self) -> None:
        if not self._changed or self._address is None:
            return
        counts = [[tp.topic, tp.partition, self._applied[tp]] for tp in sorted(self._changed)]
        self._changed.clear()
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for payload in _datagrams(self._batch_id, counts):
                self._socket.sendto(payload, self._address)
        except OSError:
            pass  # the display misses an update; the batch is unaffected


def _datagrams(batch_id: int, counts: list[list[object]]) -> list[bytes]:
    """``counts`` as JSON datagrams ``{"batch": id, "applied": [[topic, partition, n], ...]}``."""
    out: list[bytes] = []
    start = 0
    while start < len(counts):
        size = len(counts) - start
        while True:
            payload = json.dumps(
                {"batch": batch_id, "applied": counts[start : start + size]},
                separators=(",", ":"),
            ).encode()
            if len(payload) <= _MAX_DATAGRAM or size == 1:
                break
            size = max(1, size // 2)
        out.append(payload)
        start += size
    return out
