"""The status page's server: the routes it refuses and the guards in front of them, against a
real server (uvicorn on a free loopback port) over a real pipeline's checkpoint."""

from __future__ import annotations

import http.client
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.fixtures.sessions_job import sessions_config

from inorder.assemble import load_target
from inorder.commands.run import dump_toml
from inorder.errors import ConfigError
from inorder.kafka.offsets import SourceOffset
from inorder.records import TopicPartition
from inorder.ui.app import MAX_QUERY, TOKEN_COOKIE, create_app
from inorder.ui.server import UiServer, check_bind, is_loopback
from inorder.ui.status import StatusSource

TOKEN = "s3cret-token"
NAME = "ui-guarded"


def _pipeline(kafka: Any, work: Path, name: str = NAME) -> Path:
    """A session pipeline's TOML file; its checkpoint holds nothing yet (never run)."""
    config = sessions_config(kafka.bootstrap_servers, f"ui-none-{name}-", work, name=name)
    config["sink"]["storage_options"] = {"aws_secret_access_key": "do-not-show-me"}
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(config))
    return toml


@pytest.fixture(scope="module")
def served(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UiServer, Path]]:
    work = tmp_path_factory.mktemp("ui-server")
    toml = _pipeline(kafka, work)
    source = StatusSource(str(toml), load_target(str(toml)))
    server = UiServer(create_app(source, TOKEN)).start()
    yield server, work
    server.stop()


def get(
    server: UiServer, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], str]:
    """One request (no redirects followed): status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        body = response.read().decode("utf-8", "replace")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _no_trace(body: str) -> None:
    assert "Traceback" not in body and 'File "' not in body, body


def test_page_json_and_live_part_with_the_token(served: tuple[UiServer, Path]) -> None:
    server, _ = served
    status, headers, body = get(server, f"/pipelines/{NAME}", AUTH)
    assert status == 200, body
    assert headers["content-type"].startswith("text/html")
    assert "nosniff" in headers["x-content-type-options"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert f"<h1>{NAME}</h1>" in body and 'id="live"' in body
    # Secrets of the settings are masked; the rest of the configuration is shown.
    assert "do-not-show-me" not in body and "***" in body and "topic_pattern" in body
    status, _, body = get(server, f"/pipelines/{NAME}/status.json", AUTH)
    doc = json.loads(body)
    assert status == 200 and doc["pipeline"] == NAME
    assert doc["last_committed_batch"] is None and doc["batches"] == []
    assert doc["running"] is False and doc["broker"] == "reachable"
    assert "do-not-show-me" not in body
    status, _, body = get(server, f"/pipelines/{NAME}/live", AUTH)
    assert status == 200 and 'id="last-batch"' in body and "<html" not in body
    status, headers, _ = get(server, "/", AUTH)
    assert status == 303 and headers["location"] == f"/pipelines/{NAME}"


@pytest.mark.parametrize(
    "path",
    ["/pipelines/other", "/pipelines/other/status.json", "/nope", "/pipelines", "/static/x.js"],
)
def test_unknown_pipeline_or_route_is_404(served: tuple[UiServer, Path], path: str) -> None:
    status, _, body = get(served[0], path, AUTH)
    assert status == 404, body
    _no_trace(body)


@pytest.mark.parametrize(
    "path",
    [
        "/pipelines/../../etc/passwd",
        "/pipelines/%2e%2e/%2e%2e/etc/passwd",
        "/pipelines/%252e%252e%252fetc%252fpasswd",
        "/pipelines/..%2f..%2fetc%2fpasswd/status.json",
        "/pipelines/ui-guarded%5c..%5cx",
        "/pipelines/ui-guarded/..",
        "/pipelines/a%00b",
    ],
)
def test_path_traversal_is_refused(served: tuple[UiServer, Path], path: str) -> None:
    status, _, body = get(served[0], path, AUTH)
    assert status in (400, 404), (status, body)
    assert "root:" not in body
    _no_trace(body)


def test_huge_query_string_is_refused(served: tuple[UiServer, Path]) -> None:
    server, _ = served
    status, _, body = get(server, f"/pipelines/{NAME}?x=" + "a" * (MAX_QUERY + 1), AUTH)
    assert status == 414, body
    # Past what the HTTP parser buffers the request is refused before the application: with
    # a 400, or by closing the connection while the client still sends (which one depends
    # on how far the client got when the server answered, so on the machine's load).
    try:
        status, _, body = get(server, f"/pipelines/{NAME}?x=" + "a" * 100_000, AUTH)
    except (ConnectionResetError, BrokenPipeError):
        return
    assert status in (400, 414), body
    _no_trace(body)


def test_token_missing_or_wrong_is_401(served: tuple[UiServer, Path]) -> None:
    server, _ = served
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Cookie": f"{TOKEN_COOKIE}=wrong"},
    ):
        status, _, body = get(server, f"/pipelines/{NAME}/status.json", headers)
        assert status == 401, (headers, body)
        assert NAME not in body
    status, _, _ = get(server, f"/pipelines/{NAME}?token=wrong")
    assert status == 401
    # Unknown routes are not revealed to a caller without the token either.
    assert get(server, "/pipelines/other")[0] == 401
    assert get(server, "/healthz")[0] == 200


def test_token_in_the_address_moves_to_a_cookie(served: tuple[UiServer, Path]) -> None:
    server, _ = served
    status, headers, _ = get(server, f"/pipelines/{NAME}?token={TOKEN}&a=1")
    assert status == 303
    assert headers["location"] == f"/pipelines/{NAME}?a=1"
    cookie = headers["set-cookie"]
    assert cookie.startswith(f"{TOKEN_COOKIE}={TOKEN}") and "HttpOnly" in cookie
    assert "samesite=strict" in cookie.lower()
    status, _, body = get(server, f"/pipelines/{NAME}", {"Cookie": f"{TOKEN_COOKIE}={TOKEN}"})
    assert status == 200 and f"<h1>{NAME}</h1>" in body


def test_read_only(served: tuple[UiServer, Path]) -> None:
    for method in ("POST", "PUT", "DELETE"):
        status, _, body = get(served[0], f"/pipelines/{NAME}", AUTH, method)
        assert status == 405, (method, body)
        _no_trace(body)


def test_errors_never_show_a_stack_trace(kafka: Any, tmp_path: Path) -> None:
    toml = _pipeline(kafka, tmp_path, "ui-broken")
    source = StatusSource(str(toml), load_target(str(toml)))
    server = UiServer(create_app(source)).start()
    try:
        checkpoint = tmp_path / "checkpoint"
        # A planned batch whose engine record is damaged: reading it fails unexpectedly.
        (checkpoint / "spark" / "offsets").mkdir(parents=True)
        offset = SourceOffset(positions={TopicPartition("t", 0): 5})
        (checkpoint / "spark" / "offsets" / "0").write_text(f"v1\n{{}}\n{offset.to_json()}\n")
        (checkpoint / "engine" / "batches").mkdir(parents=True)
        (checkpoint / "engine" / "batches" / f"{0:020d}.json").write_text("{damaged")
        status, _, body = get(server, "/pipelines/ui-broken/status.json")
        assert status == 500 and body == "internal error (see the server's log)\n"
        # A named problem (a damaged checkpoint info file) is said in one line.
        (checkpoint / "engine" / "batches" / f"{0:020d}.json").unlink()
        (checkpoint / "inorder-checkpoint.json").write_text("{not json")
        status, _, body = get(server, "/pipelines/ui-broken")
        assert status == 503 and "inorder-checkpoint.json is damaged" in body
        assert body.count("\n") == 1
        _no_trace(body)
    finally:
        server.stop()


def test_binding_beyond_loopback_needs_the_flag() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    warn = io.StringIO()
    check_bind("127.0.0.1", False, None, warn)
    assert warn.getvalue() == ""
    with pytest.raises(ConfigError, match="--allow-remote"):
        check_bind("0.0.0.0", False, TOKEN, warn)
    check_bind("0.0.0.0", True, None, warn)
    assert "WARNING" in warn.getvalue() and "NO token" in warn.getvalue()


def test_healthz_is_open_reveals_nothing_and_the_docs_say_so(
    served: tuple[UiServer, Path],
) -> None:
    server, _ = served
    # Load balancers and probes often cannot send a token: /healthz answers without one,
    # and the same whatever token comes with it (never an oracle for guessing it).
    answers = [
        get(server, "/healthz", headers)
        for headers in ({}, AUTH, {"Authorization": "Bearer wrong"}, {"Cookie": "x=1"})
    ]
    answers.append(get(server, "/healthz?token=wrong"))
    answers.append(get(server, f"/healthz?token={TOKEN}"))
    from inorder import __version__

    for status, headers, body in answers:
        assert (status, body) == (200, "ok\n")
        assert "set-cookie" not in headers and "location" not in headers
        assert NAME not in str(headers) and __version__ not in str(headers)
    assert len({tuple(sorted(h.items())) for _, h, _ in answers}) == 1
    assert get(server, "/healthz", method="HEAD")[0] == 200
    # Everything else still needs the token, and the documentation says which is which.
    assert get(server, "/healthz/")[0] == 401
    docs = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    token = docs[docs.index("* `--token T`") :]
    token = token[: token.index("\n* ")]
    assert "every request except `/healthz` needs it" in token, token
    assert "answers `ok` to anyone" in token, token


def test_page_parameter_reaches_the_live_part(served: tuple[UiServer, Path]) -> None:
    """``?page=N`` selects the per-partition tables' rows; the page's live updates fetch the
    same page, and anything but a small number is page 1."""
    server, _ = served
    status, _, body = get(server, f"/pipelines/{NAME}?page=3", AUTH)
    assert status == 200, body
    assert f'data-src="/pipelines/{NAME}/live?page=3"' in body
    for page in ("x", "-1", "99999999999", ""):
        status, _, body = get(server, f"/pipelines/{NAME}?page={page}", AUTH)
        assert status == 200, body
        assert f'data-src="/pipelines/{NAME}/live"' in body
    status, _, body = get(server, f"/pipelines/{NAME}/live?page=2", AUTH)
    assert status == 200 and "Topic-partitions" in body
