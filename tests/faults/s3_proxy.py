"""A fault-injecting HTTP proxy on 127.0.0.1 in front of an S3 server (stdlib only).

Requests are relayed unchanged (the ``Host`` header too, so SigV4 signatures still match)
unless a fault is armed:

* :meth:`S3Proxy.errors`: the next ``count`` requests, or every request for ``seconds``, get
  an S3 error answer (503 ``SlowDown`` by default) or a reset connection, never reaching the
  server;
* :meth:`S3Proxy.trip`: the first request whose ``"METHOD /path?query"`` matches a pattern
  takes the proxy down (its listening socket closed, every open connection reset), so
  clients see the refused connections of a stopped server. ``moment`` says whether that
  request reaches the server first and whether its answer is delivered; the caller stops and
  restarts the real server, then calls :meth:`S3Proxy.up` (same port);
* :meth:`S3Proxy.lose_answer`: the first matching request reaches the server, its answer is
  dropped (connection reset): the client retries a request that already took effect;
* :meth:`S3Proxy.on`: run a callable when the first matching request arrives (to arm a
  fault at a known point of a run).

What the proxy did is counted (``requests``, ``injected``) and every relayed request is kept
in ``seen`` (``"METHOD /path -> status"``) for the test's messages.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

HOST = "127.0.0.1"
#: Headers that belong to one connection, not to the request or response they travel with.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection"}
Moment = Literal["before", "lost", "after"]


def slow_down_body() -> bytes:
    """The XML body of S3's 503 ``SlowDown`` answer."""
    return (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
        b"<Message>Please reduce your request rate.</Message></Error>"
    )


@dataclass
class _Trip:
    pattern: re.Pattern[str]
    moment: Moment
    down: threading.Event
    stay_up: bool = False


@dataclass
class _Hook:
    pattern: re.Pattern[str]
    then: Callable[[], None]


class _Reset(Exception):
    """Drop the client's connection without an answer."""


class S3Proxy:
    """The proxy, listening from construction until :meth:`close`."""

    def __init__(self, upstream_port: int, timeout: float = 60.0) -> None:
        self.upstream_port = upstream_port
        self.timeout = timeout
        self.requests = 0
        self.injected = 0
        self.seen: list[str] = []
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._error_count = 0
        self._error_until = 0.0
        self._error_status = 503
        self._error_reset = False
        self._trips: list[_Trip] = []
        self._hooks: list[_Hook] = []
        self._server: ThreadingHTTPServer | None = None
        self._down = threading.Event()
        self.port = 0
        self.up()

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    # -- faults -------------------------------------------------------------------------------

    def errors(
        self, count: int = 0, seconds: float = 0.0, status: int = 503, reset: bool = False
    ) -> None:
        """From now on, answer ``count`` requests (or all for ``seconds``) with a fault."""
        with self._lock:
            self._error_count = count
            self._error_until = time.monotonic() + seconds if seconds else 0.0
            self._error_status = status
            self._error_reset = reset

    def trip(self, pattern: str, moment: Moment = "before") -> threading.Event:
        """Go down at the first request matching ``pattern``; the event is set once down.

        ``before``: the request never reaches the server; ``lost``: it does, its answer is
        lost; ``after``: its answer is delivered, then the proxy goes down.
        """
        trip = _Trip(re.compile(pattern), moment, threading.Event())
        with self._lock:
            self._trips.append(trip)
        return trip.down

    def lose_answer(self, pattern: str) -> threading.Event:
        """Relay the first request matching ``pattern``, then reset its connection.

        The server applied the request; the client never hears so and retries it. The proxy
        stays up. The event is set once the answer is dropped.
        """
        trip = _Trip(re.compile(pattern), "lost", threading.Event(), stay_up=True)
        with self._lock:
            self._trips.append(trip)
        return trip.down

    def on(self, pattern: str, then: Callable[[], None]) -> None:
        """Call ``then`` once, when the first request matching ``pattern`` arrives."""
        with self._lock:
            self._hooks.append(_Hook(re.compile(pattern), then))

    # -- up and down --------------------------------------------------------------------------

    def up(self) -> None:
        """Listen (again, on the same port after :meth:`down`)."""
        proxy = self

        class Handler(_Relay):
            owner = proxy

        server = ThreadingHTTPServer((HOST, self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._down.clear()
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def down(self) -> None:
        """Stop listening and reset every open connection (a stopped server, to clients)."""
        self._down.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            connections = list(self._open)
        for sock in connections:
            _reset(sock)

    def close(self) -> None:
        self.down()

    # -- used by the handler ------------------------------------------------------------------

    def _fault_now(self) -> tuple[int, bool] | None:
        with self._lock:
            if self._error_count > 0:
                self._error_count -= 1
            elif time.monotonic() >= self._error_until:
                return None
            self.injected += 1
            return self._error_status, self._error_reset

    def _triggered(self, line: str) -> tuple[_Trip | None, list[_Hook]]:
        with self._lock:
            self.requests += 1
            hooks = [h for h in self._hooks if h.pattern.search(line)]
            for hook in hooks:
                self._hooks.remove(hook)
            trip = next((t for t in self._trips if t.pattern.search(line)), None)
            if trip is not None:
                self._trips.remove(trip)
                self.injected += 1
        return trip, hooks

    def _go_down(self, trip: _Trip) -> None:
        if trip.stay_up:
            trip.down.set()
            return
        self._down.set()  # at once: the listener closes within serve_forever's poll interval
        threading.Thread(target=self.down, daemon=True).start()
        trip.down.set()


def _reset(sock: socket.socket) -> None:
    """Abort a connection (RST, no answer)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)


class _Relay(BaseHTTPRequestHandler):
    owner: S3Proxy
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        with self.owner._lock:
            self.owner._open.add(self.connection)

    def finish(self) -> None:
        with self.owner._lock:
            self.owner._open.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except _Reset:
            _reset(self.connection)
            self.close_connection = True
        except OSError:
            self.close_connection = True

    def do_GET(self) -> None:
        self._relay()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while True:
                size_line = self.rfile.readline()
                raw += size_line
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                chunk = self.rfile.read(size + 2)
                raw += chunk
                if size == 0:
                    while chunk not in (b"\r\n", b"\n", b""):  # trailers
                        chunk = self.rfile.readline()
                        raw += chunk
                    return raw
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _relay(self) -> None:
        owner = self.owner
        line = f"{self.command} {self.path}"
        body = self._body()
        if owner._down.is_set():
            raise _Reset
        trip, hooks = owner._triggered(line)
        for hook in hooks:
            hook.then()
        if trip is not None and trip.moment == "before":
            owner._go_down(trip)
            raise _Reset
        fault = None if trip is not None else owner._fault_now()
        if fault is not None:
            status, reset = fault
            owner.seen.append(f"{line} -> {'reset' if reset else status} (injected)")
            if reset:
                raise _Reset
            self._answer(status, "Injected", [("Content-Type", "application/xml")],
                         slow_down_body())  # fmt: skip
            return
        try:
            status, reason, headers, data = self._forward(body)
        except OSError:
            owner.seen.append(f"{line} -> upstream unreachable")
            raise _Reset from None
        owner.seen.append(f"{line} -> {status}")
        if owner._down.is_set() or (trip is not None and trip.moment == "lost"):
            if trip is not None:
                owner._go_down(trip)
            raise _Reset
        self._answer(status, reason, headers, data)
        if trip is not None:
            owner._go_down(trip)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        upstream = http.client.HTTPConnection(HOST, self.owner.upstream_port,
                                              timeout=self.owner.timeout)  # fmt: skip
        try:
            upstream.putrequest(self.command, self.path, skip_host=True,
                                skip_accept_encoding=True)  # fmt: skip
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP - {"transfer-encoding"}:
                    upstream.putheader(name, value)
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            upstream.close()

    def _answer(
        self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes
    ) -> None:
        self.send_response_only(status, reason)
        length = None
        for name, value in headers:
            lower = name.lower()
            if lower == "content-length":
                length = value
            elif lower not in HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", length or "0")
            self.end_headers()
        else:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        self.wfile.flush()
