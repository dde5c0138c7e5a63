"""The status page's web application: read-only routes, and the guards in front of them.

Routes (``NAME`` is the pipeline's name; any other name is 404)::

    GET /                              redirects to the pipeline's page
    GET /pipelines/NAME[?page=N]       the page (N: the rows of its per-partition tables)
    GET /pipelines/NAME/live[?page=N]  its live part (HTML; the page fetches it)
    GET /pipelines/NAME/status.json    everything the page shows, as JSON
    GET /healthz                       "ok" (no token needed: for probes)

Guards, before any route runs: a request line past :data:`MAX_QUERY` / :data:`MAX_PATH`
bytes is 414; a path with ``..``, a backslash or a control character, raw or encoded, is
400; with a token, a request without it (``Authorization: Bearer``, the cookie the page
sets, or ``?token=`` once) is 401. An error never shows a stack trace: it goes to the log
and the response says one line.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from inorder.errors import InorderError
from inorder.ui.page import render_live, render_page
from inorder.ui.status import StatusSource

log = logging.getLogger(__name__)

#: Longest query string accepted (bytes).
MAX_QUERY = 2048
#: Longest path accepted (bytes).
MAX_PATH = 1024
#: The cookie holding the token once the page was opened with ``?token=``.
TOKEN_COOKIE = "inorder_ui_token"
#: Milliseconds between two live updates of the page.
LIVE_EVERY_MS = 3000

_BAD_PATH = re.compile(r"(^|/)\.\.?(/|$)|\\|[\x00-\x1f\x7f]")
_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "script-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def bad_path(raw: str) -> bool:
    """Whether a request path tries to leave its route (``..``, backslash, control chars).

    The path is checked raw and decoded twice: ``%2e%2e`` and ``%252e%252e`` count too.
    """
    once = unquote(raw)
    return any(_BAD_PATH.search(p) for p in (raw, once, unquote(once)))


class Guard:
    """ASGI middleware: request size limits, path checks, the token, safe headers."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token or None

    def _authorized(self, scope: Scope, query: dict[str, str]) -> tuple[bool, bool]:
        """(authorized, came as ``?token=``)."""
        if self.token is None or scope.get("path") == "/healthz":
            return True, False
        given: list[str] = []
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, credential = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    given.append(credential.strip())
            elif name == b"cookie":
                for part in value.decode("latin-1").split(";"):
                    key, _, cookie = part.strip().partition("=")
                    if key == TOKEN_COOKIE:
                        given.append(cookie)
        in_query = "token" in query
        if in_query:
            given.append(query["token"])
        expected = self.token.encode()
        ok = any(hmac.compare_digest(g.encode(), expected) for g in given)
        return ok, ok and in_query

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_query: bytes = scope.get("query_string", b"")
        raw_path: bytes = scope.get("raw_path") or scope.get("path", "").encode()
        if len(raw_query) > MAX_QUERY or len(raw_path) > MAX_PATH:
            await _plain(414, "request too long", send)
            return
        if bad_path(raw_path.decode("latin-1")):
            await _plain(400, "bad path", send)
            return
        query = dict(parse_qsl(raw_query.decode("latin-1"), keep_blank_values=True))
        ok, from_query = self._authorized(scope, query)
        if not ok:
            await _plain(401, "a valid token is needed (?token=... or Authorization: Bearer)", send)
            return
        if from_query:
            # Keep the token out of the address bar, history and logs from now on: it moves
            # to an HttpOnly cookie and the page reloads without it.
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            target = quote(scope.get("path", "/")) + (f"?{rest}" if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(
                TOKEN_COOKIE, self.token or "", httponly=True, samesite="strict", path="/"
            )
            await response(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in _HEADERS.items()]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _plain(status: int, text: str, send: Send) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *[(k.lower().encode(), v.encode()) for k, v in _HEADERS.items()],
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def create_app(source: StatusSource, token: str | None = None) -> ASGIApp:
    """The application serving ``source``'s pipeline (read-only: GET and HEAD only)."""
    name = source.name
    base = f"/pipelines/{quote(name, safe='')}"

    def known(request: Request) -> None:
        if request.path_params["name"] != name:
            raise _NotFound

    async def status_doc(request: Request) -> dict[str, Any]:
        known(request)
        doc: dict[str, Any] = await run_in_threadpool(source.status)
        return doc

    async def page(request: Request) -> Response:
        doc = await status_doc(request)
        number = _page(request)
        live_src = f"{base}/live" + (f"?page={number}" if number > 1 else "")
        return HTMLResponse(render_page(doc, live_src, LIVE_EVERY_MS, number))

    async def live(request: Request) -> Response:
        return HTMLResponse(render_live(await status_doc(request), _page(request)))

    async def status_json(request: Request) -> Response:
        return JSONResponse(await status_doc(request))

    async def root(request: Request) -> Response:
        return RedirectResponse(base, status_code=303)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def not_found(request: Request, exc: Exception) -> Response:
        return PlainTextResponse("not found\n", status_code=404)

    async def failed(request: Request, exc: Exception) -> Response:
        if isinstance(exc, InorderError):
            # A named, one-line problem (e.g. a damaged checkpoint file): say it.
            return PlainTextResponse(f"{exc}\n", status_code=503)
        log.exception("status page request %s failed", request.url.path)
        return PlainTextResponse("internal error (see the server's log)\n", status_code=500)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = int(getattr(exc, "status_code", 500))
        text = {404: "not found", 405: "method not allowed"}.get(status, "error")
        return PlainTextResponse(f"{text}\n", status_code=status)

    from starlette.exceptions import HTTPException

    app = Starlette(
        routes=[
            Route("/", root),
            Route("/healthz", healthz),
            Route("/pipelines/{name}", page),
            Route("/pipelines/{name}/live", live),
            Route("/pipelines/{name}/status.json", status_json),
        ],
        exception_handlers={
            _NotFound: not_found,
            HTTPException: http_error,
            Exception: failed,
        },
    )
    return Guard(app, token)


def _page(request: Request) -> int:
    """The ``?page=N`` of the per-partition tables (1 when absent or not a number)."""
    text = request.query_params.get("page", "1")
    return int(text) if text.isdigit() and len(text) < 9 else 1


class _NotFound(Exception):
    """The name in the path is not this server's pipeline."""
