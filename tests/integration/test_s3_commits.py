"""S3 commits through a kept object-store library: every credential provider, honest errors.

Against the real S3 server (SeaweedFS, or ``$INORDER_S3_ENDPOINT``):

* with role-style credentials (no static keys: a container credentials endpoint, as EKS Pod
  Identity serves them) a create-only write is still atomic: of many concurrent writers of
  one manifest exactly one wins, and the object holds the winner's bytes;
* a failure says what really failed: DNS, a refused connection, a missing bucket, a rejected
  signature; a bucket named ``nosuchbucket`` behind an unresolvable host is a DNS problem;
* an ``s3://`` output in the bucket of the running dev S3 server finds that server, as the
  docs say, with no storage options.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.fixtures.services import S3Service

from inorder.dev import processes
from inorder.sinks.base import SinkError
from inorder.sinks.parquet import check_writable
from inorder.storage import fs as sfs
from inorder.storage import s3_objects

TOKEN = "pod-identity-token"


class _CredentialsEndpoint:
    """A container credentials endpoint (the ECS / EKS Pod Identity protocol) on loopback."""

    def __init__(self, access_key_id: str, secret_access_key: str) -> None:
        self.requests = 0
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.headers.get("Authorization") != TOKEN:
                    self.send_error(401)
                    return
                endpoint.requests += 1
                expires = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
                body = json.dumps(
                    {
                        "AccessKeyId": access_key_id,
                        "SecretAccessKey": secret_access_key,
                        "Token": "",
                        "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1/credentials"


@pytest.fixture
def role_credentials(
    s3: S3Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_CredentialsEndpoint]:
    """No static keys anywhere: credentials come only from a container credentials endpoint."""
    endpoint = _CredentialsEndpoint(s3.access_key_id, s3.secret_access_key)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", endpoint.url)
    monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(token_file))
    s3_objects.store.cache_clear()
    yield endpoint
    s3_objects.store.cache_clear()
    endpoint.server.shutdown()


def test_create_only_writes_stay_atomic_with_role_credentials(
    s3: S3Service, role_credentials: _CredentialsEndpoint
) -> None:
    location = sfs.resolve(s3.new_prefix(), {"endpoint_url": s3.endpoint_url})
    assert location.s3 is not None and location.s3.access_key_id is None
    check_writable(location)  # the store honours If-None-Match: *

    writers = 8
    for round_ in range(5):
        path = location.join("_inorder", "commits", f"{round_:020d}.json")
        winners: list[bytes] = []
        barrier = threading.Barrier(writers)

        def write(
            data: bytes,
            path: str = path,
            barrier: threading.Barrier = barrier,
            winners: list[bytes] = winners,
        ) -> None:
            barrier.wait()
            try:
                sfs.put_if_absent(location, path, data)
            except sfs.AlreadyExists:
                return
            winners.append(data)

        threads = [
            threading.Thread(target=write, args=(f"writer-{w}".encode() * 2000,))
            for w in range(writers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(winners) == 1, f"round {round_}: {len(winners)} writers created {path}"
        assert sfs.read_bytes_if_exists(location, path) == winners[0]
    assert role_credentials.requests >= 1  # signed with the provider's credentials


def test_a_broken_credentials_setup_is_one_error_line(
    s3: S3Service, role_credentials: _CredentialsEndpoint, tmp_path: Path
) -> None:
    # `echo token > file` leaves a newline that is no valid header value: obstore panics.
    (tmp_path / "token").write_text(TOKEN + "\n")
    location = sfs.resolve(s3.new_prefix(), {"endpoint_url": s3.endpoint_url})
    with pytest.raises(SinkError, match=r"is not usable: S3 PUT s3://\S+ failed: ") as caught:
        check_writable(location)
    assert "\n" not in str(caught.value)


def _refused_port() -> int:
    (port,) = processes.free_ports(1)
    return port


@pytest.mark.parametrize(
    ("case", "expected", "not_expected"),
    [
        ("missing bucket", "bucket 'nosuchbucket' does not exist at http://", "DNS"),
        ("dns", "host name 'no-such-host.invalid' (DNS)", "does not exist"),
        ("refused", "connection refused by http://127.0.0.1:", "does not exist"),
        ("wrong secret", "signature rejected (check the secret access key)", "does not exist"),
    ],
)
def test_s3_failures_say_what_failed(
    s3: S3Service, case: str, expected: str, not_expected: str
) -> None:
    options = {
        "endpoint_url": s3.endpoint_url,
        "access_key_id": s3.access_key_id,
        "secret_access_key": s3.secret_access_key,
        "region": s3.region,
    }
    bucket = "nosuchbucket"
    if case == "dns":
        options["endpoint_url"] = "http://no-such-host.invalid:9000"
    elif case == "refused":
        options["endpoint_url"] = f"http://127.0.0.1:{_refused_port()}"
    elif case == "wrong secret":
        options["secret_access_key"] = "wrong-secret-value"
        bucket = s3.bucket
    uri = f"s3://{bucket}/out-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SinkError) as caught:
        check_writable(sfs.resolve(uri, options))
    message = str(caught.value)
    assert message.startswith(f"{uri} is not usable: ") and "\n" not in message, message
    reason = message.rsplit(" failed: ", 1)[-1]
    assert expected in reason and not_expected not in reason, message
    assert "wrong-secret-value" not in message and s3.secret_access_key not in message


def test_a_missing_bucket_is_an_error_not_an_empty_dataset(s3: S3Service) -> None:
    location = sfs.resolve("s3://nosuchbucket/out", s3.storage_options())
    with pytest.raises(SinkError, match="bucket 'nosuchbucket' does not exist"):
        sfs.read_bytes_if_exists(location, location.join("_inorder", "commits", "0.json"))
    with pytest.raises(SinkError, match="bucket 'nosuchbucket' does not exist"):
        sfs.delete_quietly(location, location.join("_inorder", "x"))


def test_an_s3_output_finds_the_dev_s3_server(
    s3: S3Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inorder.assemble import make_sink
    from inorder.endpoints import ENV_S3_ENDPOINT, ENV_STATE_DIR

    if s3.external:
        pytest.skip("the dev S3 server is not running: $INORDER_S3_ENDPOINT names the store")
    assert s3.state_dir is not None
    # No key pair in the environment either: it would be used before the server's record.
    for var in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        ENV_S3_ENDPOINT,
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ENV_STATE_DIR, str(s3.state_dir))
    spec = {
        "type": "parquet",
        "path": s3.new_prefix(),
        "partition_by": [],
        "compression": "zstd",
        "target_file_size": 128 * 1024 * 1024,
        "storage_options": {},
    }
    sink = make_sink(spec)
    check_writable(sfs.resolve(sink.path, sink.storage_options))

    # Another bucket is not the dev server's: it is left to the AWS defaults.
    other = make_sink({**spec, "path": "s3://some-aws-bucket/out"})
    assert not other.storage_options


def test_a_store_that_ignores_conditional_writes_is_refused(
    s3: S3Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    import obstore

    real_put = obstore.put

    def put_ignoring_the_condition(store: Any, path: str, data: bytes, **kwargs: Any) -> Any:
        # What a store without If-None-Match support does: every PUT overwrites.
        kwargs.pop("mode", None)
        return real_put(store, path, data, **kwargs)

    monkeypatch.setattr(obstore, "put", put_ignoring_the_condition)
    uri = s3.new_prefix()
    with pytest.raises(SinkError, match="ignored a conditional write") as caught:
        check_writable(sfs.resolve(uri, s3.storage_options()))
    assert "exactly-once" in str(caught.value)
