"""Serving the status page: on loopback unless told otherwise, in a thread of its own.

The socket is bound before the server starts, so ``--port 0`` gets a free port whose URL is
known (and printed) at once. :class:`UiServer` runs uvicorn in a daemon thread: beside a
running pipeline (``inorder run --ui``) or in the foreground of ``inorder ui``.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
import time
from typing import TextIO

from inorder.errors import ConfigError
from inorder.ui.app import ASGIApp

#: Environment variable holding the page's token when ``--token`` is not given.
TOKEN_ENV = "INORDER_UI_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, allow_remote: bool, token: str | None, warn: TextIO) -> None:
    """Refuse a non-loopback address without ``--allow-remote``; warn when it is given."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ConfigError(
            f"--host {host}: the status page binds to loopback only unless --allow-remote "
            "is given (it then shows the pipeline's offsets, state sizes and settings to "
            "anyone who can reach this address; set a token with --token or $INORDER_UI_TOKEN)"
        )
    protection = "token required" if token else "NO token: anyone who can reach it may read it"
    print(
        f"inorder ui: WARNING: serving on {host}, reachable from other machines ({protection})",
        file=warn,
        flush=True,
    )


class UiServer:
    """uvicorn serving an application on one bound socket, in a daemon thread."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host.strip("[]"), port))
        except OSError as exc:
            self._socket.close()
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({exc})") from None
        self._socket.listen(64)
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            server_header=False,
            date_header=False,
            # The page is read-only and small: a bound on what a client may send.
            h11_max_incomplete_event_size=16 * 1024,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True,
            name="inorder-ui",
        )  # fmt: skip

    @property
    def url(self) -> str:
        """The server's base URL."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> UiServer:
        """Start serving; return once the server accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"the status page did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (open connections get ``timeout`` seconds to finish)."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._socket.close()

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C stops it)."""
        try:
            while self._thread.is_alive():
                self._thread.join(0.5)
        finally:
            self.stop()


def announce(url: str, path: str, token: str | None, out: TextIO = sys.stderr) -> None:
    """Print where the page is (the token itself is never printed)."""
    suffix = "  (append ?token=<your token> once; it is then kept in a cookie)" if token else ""
    print(f"inorder ui: status page at {url}{path}{suffix}", file=out, flush=True)
