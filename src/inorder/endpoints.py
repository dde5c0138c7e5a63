"""Where the Kafka broker, the S3 store and the schema registry are, for every command and test.

Resolution order, for each service separately:

1. explicit environment variables (an external Kafka cluster, a real S3):
   ``INORDER_KAFKA_BOOTSTRAP_SERVERS``; ``INORDER_S3_ENDPOINT`` with ``AWS_ACCESS_KEY_ID``,
   ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` (default ``us-east-1``) and ``INORDER_S3_BUCKET``
   (default ``inorder``); ``INORDER_SCHEMA_REGISTRY_URL``;
2. the dev services started by ``inorder dev up`` (``services.json`` in the state directory),
   if their process is still running;
3. otherwise :class:`~inorder.errors.ConfigError` saying how to fix it.

An ``s3://`` output in that store's bucket takes the store's endpoint; its key pair comes from
the output's ``storage_options``, else ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY``, else
the store's record (:func:`output_storage_options`).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from inorder.errors import ConfigError
from inorder.pids import process_alive

if TYPE_CHECKING:
    import pyarrow.fs

ENV_KAFKA = "INORDER_KAFKA_BOOTSTRAP_SERVERS"
ENV_S3_ENDPOINT = "INORDER_S3_ENDPOINT"
ENV_S3_BUCKET = "INORDER_S3_BUCKET"
ENV_STATE_DIR = "INORDER_STATE_DIR"
ENV_ACCESS_KEY = "AWS_ACCESS_KEY_ID"
ENV_SECRET_KEY = "AWS_SECRET_ACCESS_KEY"
ENV_REGION = "AWS_REGION"
ENV_SCHEMA_REGISTRY = "INORDER_SCHEMA_REGISTRY_URL"

DEFAULT_STATE_DIR = Path(".inorder") / "dev"
DEFAULT_REGION = "us-east-1"
DEFAULT_BUCKET = "inorder"
SERVICES_FILE = "services.json"


@dataclass(frozen=True)
class S3Settings:
    """An S3 endpoint, credentials and the bucket inorder uses (secret kept out of ``repr``)."""

    endpoint_url: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    region: str = DEFAULT_REGION
    bucket: str = DEFAULT_BUCKET

    def storage_options(self) -> dict[str, str]:
        """Options for deltalake / object_store (``DeltaTable(uri, storage_options=...)``)."""
        options = {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": self.region,
        }
        if self.endpoint_url.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
        return options

    def pyarrow_fs(
        self, timeout: float | None = None, create_buckets: bool = False
    ) -> pyarrow.fs.S3FileSystem:
        """A ``pyarrow.fs.S3FileSystem`` for this endpoint (paths are ``bucket/key``).

        With ``timeout`` each request gets that many seconds and one attempt (health checks);
        ``create_buckets`` lets ``create_dir("name")`` create a bucket.
        """
        from pyarrow import fs

        parsed = urllib.parse.urlsplit(self.endpoint_url)
        kwargs: dict[str, Any] = {}
        if timeout is not None:
            kwargs = {
                "connect_timeout": timeout,
                "request_timeout": timeout,
                "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=1),
            }
        return fs.S3FileSystem(
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            region=self.region,
            endpoint_override=parsed.netloc,
            scheme=parsed.scheme or "https",
            allow_bucket_creation=create_buckets,
            **kwargs,
        )

    def list_buckets(self, timeout: float = 5.0) -> list[str]:
        """The bucket names (ListBuckets); ``OSError`` with the server's reason on failure."""
        from pyarrow import fs

        selector = fs.FileSelector("", recursive=False)
        return [info.path for info in self.pyarrow_fs(timeout).get_file_info(selector)]

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (``OSError`` on failure)."""
        from pyarrow import fs

        filesystem = self.pyarrow_fs(timeout=10.0, create_buckets=True)
        if filesystem.get_file_info(self.bucket).type == fs.FileType.NotFound:
            filesystem.create_dir(self.bucket)

    def uri(self, key: str = "") -> str:
        """``s3://bucket/key`` for a key in this bucket."""
        return f"s3://{self.bucket}/{key.lstrip('/')}"


def resolve_state_dir(state_dir: str | os.PathLike[str] | None = None) -> Path:
    """The dev-services state directory: argument, else ``$INORDER_STATE_DIR``, else default."""
    if state_dir is not None:
        return Path(state_dir)
    env = os.environ.get(ENV_STATE_DIR)
    return Path(env) if env else DEFAULT_STATE_DIR


def read_services_file(state_dir: Path) -> dict[str, Any]:
    """The parsed ``services.json`` of a state directory, ``{}`` if there is none."""
    path = state_dir / SERVICES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON (line {exc.lineno}): remove it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object: remove it")
    return data


def _running_entry(state_dir: Path, name: str) -> dict[str, Any] | None:
    entry = read_services_file(state_dir).get(name)
    if not isinstance(entry, dict) or not entry.get("pid"):
        return None
    if not process_alive(int(entry["pid"]), entry.get("start_time")):
        return None
    return entry


def _not_configured(what: str, name: str, env: str, state_dir: Path) -> ConfigError:
    """The error for a service found neither in the environment nor in ``state_dir``.

    Names the state directory that was searched and whether it records a stopped service:
    a user whose services run under another ``--state-dir`` must not be sent to start a
    second, empty broker beside them.
    """
    entry = read_services_file(state_dir).get(name)
    services = state_dir / SERVICES_FILE
    if isinstance(entry, dict) and entry.get("pid"):
        found = f"the {name} service recorded in {services} (pid {entry['pid']}) is not running"
    else:
        found = f"no {name} service is recorded in {services}"
    return ConfigError(
        f"no {what} configured: {found}; run `inorder dev up` (with the --state-dir the "
        f"services were started with, or {ENV_STATE_DIR} set to it) or set {env}"
    )


def kafka_bootstrap_servers(state_dir: str | os.PathLike[str] | None = None) -> str:
    """Bootstrap servers: ``$INORDER_KAFKA_BOOTSTRAP_SERVERS``, else the running dev broker."""
    env = os.environ.get(ENV_KAFKA, "").strip()
    if env:
        return env
    directory = resolve_state_dir(state_dir)
    entry = _running_entry(directory, "kafka")
    if entry is None:
        raise _not_configured("Kafka broker", "kafka", ENV_KAFKA, directory)
    return str(entry["bootstrap_servers"])


def s3_settings(state_dir: str | os.PathLike[str] | None = None) -> S3Settings:
    """S3 settings: ``$INORDER_S3_ENDPOINT`` (+ ``AWS_*``), else the running dev S3 server."""
    endpoint = os.environ.get(ENV_S3_ENDPOINT, "").strip()
    if endpoint:
        missing = [n for n in (ENV_ACCESS_KEY, ENV_SECRET_KEY) if not os.environ.get(n)]
        if missing:
            raise ConfigError(f"{ENV_S3_ENDPOINT} is set but {' and '.join(missing)} is not")
        if not endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"{ENV_S3_ENDPOINT} must start with http:// or https:// (got {endpoint!r})"
            )
        return S3Settings(
            endpoint_url=endpoint.rstrip("/"),
            access_key_id=os.environ[ENV_ACCESS_KEY],
            secret_access_key=os.environ[ENV_SECRET_KEY],
            region=os.environ.get(ENV_REGION) or DEFAULT_REGION,
            bucket=os.environ.get(ENV_S3_BUCKET) or DEFAULT_BUCKET,
        )
    directory = resolve_state_dir(state_dir)
    entry = _running_entry(directory, "s3")
    if entry is None:
        raise _not_configured("S3 store", "s3", ENV_S3_ENDPOINT, directory)
    return S3Settings(
        endpoint_url=str(entry["endpoint_url"]),
        access_key_id=str(entry["access_key_id"]),
        secret_access_key=str(entry["secret_access_key"]),
        region=str(entry.get("region") or DEFAULT_REGION),
        bucket=str(entry.get("bucket") or DEFAULT_BUCKET),
    )


def schema_registry_url(state_dir: str | os.PathLike[str] | None = None) -> str:
    """Registry URL: ``$INORDER_SCHEMA_REGISTRY_URL``, else the running dev schema registry."""
    env = os.environ.get(ENV_SCHEMA_REGISTRY, "").strip()
    if env:
        return env
    directory = resolve_state_dir(state_dir)
    entry = _running_entry(directory, "registry")
    if entry is None:
        raise _not_configured("schema registry", "registry", ENV_SCHEMA_REGISTRY, directory)
    return str(entry["url"])


def output_storage_options(
    path: str, given: Mapping[str, str] | None, state_dir: str | os.PathLike[str] | None = None
) -> dict[str, str] | None:
    """Storage options for an ``s3://`` output: ``given``, else the dev or named S3 store.

    When nothing names an S3 endpoint (no ``endpoint_url`` option, no ``AWS_ENDPOINT_URL``)
    and the output's bucket is the bucket of ``$INORDER_S3_ENDPOINT`` or of the S3 server
    ``inorder dev up`` runs, that store's endpoint is used, as the Kafka broker is found.
    Its credentials come, in this order, from ``given``, from ``AWS_ACCESS_KEY_ID`` +
    ``AWS_SECRET_ACCESS_KEY`` in the environment, else from the store's record
    (``services.json``): the usual AWS order, so a key pair exported for this run is never
    silently replaced. Anything else (a local path, a named endpoint, another bucket: AWS
    itself) is left as given.
    """
    from inorder.storage.fs import S3Settings as OutputSettings

    options = dict(given or {})
    if (
        path.startswith(("s3://", "s3a://"))
        and not OutputSettings.from_options(options).endpoint_url
    ):
        try:
            store = s3_settings(state_dir)
        except ConfigError:
            store = None
        if store is not None and path.split("://", 1)[1].split("/", 1)[0] == store.bucket:
            found = {"endpoint_url": store.endpoint_url, "region": store.region}
            if _credentials_source(options, store) == "store":
                found["access_key_id"] = store.access_key_id
                found["secret_access_key"] = store.secret_access_key
            options = {**found, **options}
    return options or None


CredentialsSource = Literal["given", "environment", "store"]


def _credentials_source(options: Mapping[str, str], store: S3Settings) -> CredentialsSource:
    """``"given"``, ``"environment"`` or ``"store"``: where an output's S3 key pair comes from.

    A half-given pair is refused rather than completed from elsewhere: a key id of one
    identity with the secret of another only fails later, as a signature mismatch.
    """
    from inorder.storage.fs import S3Settings as OutputSettings

    explicit = OutputSettings.from_options(options, env={})
    if explicit.access_key_id or explicit.secret_access_key:
        if not (explicit.access_key_id and explicit.secret_access_key):
            raise ConfigError(
                "storage_options: access_key_id and secret_access_key go together (one is given)"
            )
        return "given"
    key_id, secret = os.environ.get(ENV_ACCESS_KEY), os.environ.get(ENV_SECRET_KEY)
    if not key_id and not secret:
        return "store"
    if not (key_id and secret):
        missing = ENV_SECRET_KEY if key_id else ENV_ACCESS_KEY
        present = ENV_ACCESS_KEY if key_id else ENV_SECRET_KEY
        raise ConfigError(
            f"{present} is set but {missing} is not: set both to use that key pair for "
            f"{store.endpoint_url}, or unset it to use the dev server's own"
        )
    if (key_id, secret) != (store.access_key_id, store.secret_access_key):
        _note_once(
            f"S3 {store.endpoint_url}: using the key pair in {ENV_ACCESS_KEY} / "
            f"{ENV_SECRET_KEY} from the environment, not the dev server's own "
            "(services.json); unset them to use that one"
        )
    return "environment"


_noted: set[str] = set()


def _note_once(text: str) -> None:
    """One line on stderr per process (outputs share a store: the note is about the store)."""
    if text not in _noted:
        _noted.add(text)
        print(f"inorder: {text}", file=sys.stderr)
