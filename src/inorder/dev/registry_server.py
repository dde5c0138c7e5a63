"""A local Confluent-compatible schema registry over HTTP, for ``inorder dev up``.

It serves the REST calls confluent-kafka's ``SchemaRegistryClient`` makes for its Avro,
Protobuf and JSON Schema serializers and deserializers, and the usual management calls::

    GET  /schemas/types                     GET  /schemas/ids/{id}[/schema|/subjects|/versions]
    GET  /subjects                          POST /subjects/{s}            (lookup)
    GET  /subjects/{s}/versions             POST /subjects/{s}/versions   (register)
    GET  /subjects/{s}/versions/{v|latest}[/schema|/referencedby]
    DELETE /subjects/{s}[?permanent=true]   DELETE /subjects/{s}/versions/{v}[?permanent=true]
    GET|PUT|DELETE /config[/{s}]            POST /compatibility/subjects/{s}/versions[/{v}]
    GET  /mode[/{s}]                        GET  /

Answers and error codes are the Confluent registry's (``{"error_code": 40401, "message":
...}``); the data model and the compatibility checks are :mod:`inorder.dev.registry_store`'s.
It listens on 127.0.0.1 only and asks for no credentials: a development stand-in, not a
server to expose. Run it as ``python -m inorder.dev.registry_server --port N --data-dir D``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from inorder.dev.registry_compat import SCHEMA_TYPES
from inorder.dev.registry_store import RegistryError, RegistryStore

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
DATA_FILE = "registry.json"

Query = dict[str, str]
Route = Callable[[RegistryStore, "list[str]", Query, Any], Any]


def _flag(query: Query, name: str) -> bool:
    return query.get(name, "false").lower() == "true"


def _schema_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RegistryError(404, 40403, f"Schema {text} not found") from None


# --------------------------------------------------------------------------- routes


def _by_id(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    sid = _schema_id(m[0])
    tail = m[1]
    if tail == "":
        return store.body(sid)
    if tail == "/schema":
        text = store.schema(sid)["schema"]
        return json.loads(text) if _is_json(store, sid) else text
    deleted = _flag(q, "deleted")
    store.schema(sid)
    uses = store.uses(sid, deleted)
    if "subject" in q:
        uses = [u for u in uses if u[0] == q["subject"]]
    if tail == "/subjects":
        return sorted({subject for subject, _ in uses})
    return [{"subject": s, "version": v} for s, v in uses]


def _is_json(store: RegistryStore, sid: int) -> bool:
    return str(store.schema(sid)["schemaType"]) in ("AVRO", "JSON")


def _subjects(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    prefix = q.get("subjectPrefix", "")
    return [s for s in store.subject_names(_flag(q, "deleted")) if s.startswith(prefix)]


def _versions(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    return [v["version"] for v in store.versions(m[0], _flag(q, "deleted"))]


def _version(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    subject, version, tail = m
    entry = store.version(subject, version, _flag(q, "deleted"))
    if tail == "/referencedby":
        return store.referenced_by(subject, int(entry["version"]))
    answer = {"subject": subject, "version": entry["version"], **store.body(entry["id"])}
    if tail == "/schema":
        return json.loads(answer["schema"]) if _is_json(store, entry["id"]) else answer["schema"]
    return answer


def _register(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    return store.register(m[0], body)


def _lookup(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    return store.lookup(m[0], body, _flag(q, "deleted"))


def _delete_subject(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    return store.delete_subject(m[0], _flag(q, "permanent"))


def _delete_version(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    return store.delete_version(m[0], m[1], _flag(q, "permanent"))


def _subject_or_global(m: list[str]) -> str | None:
    return m[0] if m and m[0] else None


def _get_config(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    subject = _subject_or_global(m)
    return {"compatibilityLevel": store.level(subject, _flag(q, "defaultToGlobal"))}


def _put_config(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    level = body.get("compatibility") if isinstance(body, dict) else None
    return {"compatibility": store.set_level(_subject_or_global(m), level)}


def _delete_config(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    return {"compatibilityLevel": store.clear_level(_subject_or_global(m))}


def _compatibility(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    subject, version = m
    problems = store.compatibility(subject, body, version or None)
    answer: dict[str, Any] = {"is_compatible": not problems}
    if _flag(q, "verbose"):
        answer["messages"] = problems
    return answer


def _mode(store: RegistryStore, m: list[str], q: Query, body: Any) -> Any:
    return {"mode": "READWRITE"}


_S = r"([^/]+)"  # one path segment (subjects arrive percent-encoded)
ROUTES: list[tuple[str, re.Pattern[str], Route]] = [
    ("GET", re.compile(r"/"), lambda store, m, q, b: {}),
    ("GET", re.compile(r"/schemas/types"), lambda store, m, q, b: list(SCHEMA_TYPES)),
    ("GET", re.compile(rf"/schemas/ids/{_S}(|/schema|/subjects|/versions)"), _by_id),
    ("GET", re.compile(r"/subjects"), _subjects),
    ("GET", re.compile(rf"/subjects/{_S}/versions"), _versions),
    ("GET", re.compile(rf"/subjects/{_S}/versions/{_S}(|/schema|/referencedby)"), _version),
    ("POST", re.compile(rf"/subjects/{_S}/versions"), _register),
    ("POST", re.compile(rf"/subjects/{_S}"), _lookup),
    ("DELETE", re.compile(rf"/subjects/{_S}"), _delete_subject),
    ("DELETE", re.compile(rf"/subjects/{_S}/versions/{_S}"), _delete_version),
    ("GET", re.compile(r"/config(?:/([^/]+))?"), _get_config),
    ("PUT", re.compile(r"/config(?:/([^/]+))?"), _put_config),
    ("DELETE", re.compile(r"/config(?:/([^/]+))?"), _delete_config),
    ("POST", re.compile(rf"/compatibility/subjects/{_S}/versions(?:/([^/]+))?"), _compatibility),
    ("GET", re.compile(r"/mode(?:/([^/]+))?"), _mode),
]


def handle(store: RegistryStore, method: str, target: str, raw: bytes) -> tuple[int, Any]:
    """The (status, JSON body) answering one request; never raises for a bad request."""
    parts = urlsplit(target)
    path = parts.path.rstrip("/") or "/"
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    allowed = False
    for verb, pattern, route in ROUTES:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        if verb != method:
            allowed = True
            continue
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError as exc:
            return 400, {"error_code": 400, "message": f"request body is not JSON: {exc}"}
        groups = [unquote(g) if g is not None else "" for g in match.groups()]
        try:
            with store.lock:  # readers too: a concurrent register must not change a dict mid-walk
                return 200, route(store, groups, query, body)
        except RegistryError as exc:
            return exc.status, {"error_code": exc.code, "message": exc.message}
    if allowed:
        return 405, {"error_code": 405, "message": f"HTTP method {method} not allowed on {path}"}
    return 404, {"error_code": 404, "message": f"HTTP 404 Not Found: no endpoint {path}"}


def make_server(store: RegistryStore, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server answering registry requests from ``store`` (not started)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connection

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                status, body = handle(store, self.command, self.path, raw)
            except Exception as exc:  # a bug here must answer, not drop the connection
                status, body = 500, {"error_code": 50001, "message": f"internal error: {exc}"}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            # Requests hold no credentials (none are asked for); one line each to the log.
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    ThreadingHTTPServer.daemon_threads = True
    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    """Serve until terminated (``inorder dev up`` starts it; ``down`` sends SIGTERM)."""
    parser = argparse.ArgumentParser(
        prog="python -m inorder.dev.registry_server",
        description="Local Confluent-compatible schema registry (development only).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="port to listen on, e.g. 8081")
    parser.add_argument("--data-dir", required=True, help="where registry.json is kept")
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    store = RegistryStore(data_dir / DATA_FILE)
    server = make_server(store, args.host, args.port)
    print(
        f"schema registry listening on http://{args.host}:{args.port} "
        f"({len(store.schemas)} schema(s), data {data_dir / DATA_FILE})",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
