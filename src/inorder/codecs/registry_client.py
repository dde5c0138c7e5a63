"""Where the schema registry is, how to log in, and one client per worker process.

:class:`SchemaRegistry` holds the settings a codec pickles to executors; the
``confluent_kafka`` client itself is created lazily in each process
(:func:`registry_client`) and shared by every codec with the same settings, so writer schemas
fetched by id are cached for the life of the worker, never per task.

Credentials are read from environment variables when the settings are made (on the driver,
so a missing variable fails the pipeline at start) and are never shown: ``repr`` and every
error message print ``***`` and the URL without its user-info.
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from inorder.codecs.registry_errors import (
    FramingError,
    MalformedPayloadError,
    RegistryUnavailableError,
    SchemaDecodeError,
    UnknownSchemaIdError,
    UnresolvableSchemaError,
    WrongMagicByteError,
)
from inorder.errors import ConfigError

#: The registry URL when a codec names none.
ENV_REGISTRY_URL = "INORDER_SCHEMA_REGISTRY_URL"


class Secret:
    """A credential: compared and hashed by value, never printed."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The credential itself, for the client's configuration only."""
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Secret, (self._value,))


def _from_env(name: str, what: str) -> Secret | None:
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"codec: environment variable {name} (the registry {what}) is not set")
    return Secret(value)


def safe_url(url: str) -> str:
    """``url`` without user-info (``http://user:pw@host`` -> ``http://host``)."""
    shown = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        host = parts.netloc.rsplit("@", 1)[-1]
        shown.append(urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)))
    return ",".join(shown)


def _dev_registry_url() -> str:
    """The running ``inorder dev up`` registry's URL, ``""`` if there is none."""
    from inorder.endpoints import schema_registry_url

    try:
        return schema_registry_url()
    except ConfigError:
        return ""


class SchemaRegistry:
    """Where a Confluent-compatible schema registry is and how to reach it.

    ``url`` defaults to ``$INORDER_SCHEMA_REGISTRY_URL``, else the registry ``inorder dev
    up`` runs (found through its ``services.json``, as the broker is); ``mock://name`` is
    confluent-kafka's in-memory registry (one per process: for tests). Basic auth
    (``user:password``) and a static bearer token come from the environment variables named
    by ``user_info_env`` and ``bearer_token_env`` (or, from Python, directly as
    ``user_info`` / ``bearer_token``).
    ``max_retries``, ``retries_wait_ms`` and ``timeout_s`` are the client's own retry
    settings for refused connections, timeouts and HTTP 408/429/5xx answers.
    """

    def __init__(
        self,
        url: str = "",
        *,
        user_info_env: str = "",
        bearer_token_env: str = "",
        user_info: str | None = None,
        bearer_token: str | None = None,
        bearer_logical_cluster: str = "",
        max_retries: int = 3,
        retries_wait_ms: int = 1000,
        timeout_s: float = 10.0,
    ) -> None:
        url = url or os.environ.get(ENV_REGISTRY_URL, "") or _dev_registry_url()
        if not url:
            raise ConfigError(
                f"codec: no schema registry URL (set codec.registry_url or {ENV_REGISTRY_URL}, "
                "or run `inorder dev up` for a local one)"
            )
        if not url.startswith(("http://", "https://", "mock://")):
            raise ConfigError(
                f"codec.registry_url {safe_url(url)!r} must start with http://, https:// or mock://"
            )
        if max_retries < 0 or retries_wait_ms < 0 or timeout_s <= 0:
            raise ConfigError("codec: registry retries and waits must be >= 0 and the timeout > 0")
        self.url = url
        self.user_info = Secret(user_info) if user_info else _from_env(user_info_env, "user info")
        if self.user_info is not None and ":" not in self.user_info.reveal():
            raise ConfigError(
                "codec: registry user info must be 'user:password' "
                f"(from {user_info_env or 'user_info'})"
            )
        self.bearer_token = (
            Secret(bearer_token) if bearer_token else _from_env(bearer_token_env, "bearer token")
        )
        self.bearer_logical_cluster = bearer_logical_cluster
        self.max_retries = max_retries
        self.retries_wait_ms = retries_wait_ms
        self.timeout_s = timeout_s

    def _key(self) -> tuple[Any, ...]:
        return (
            self.url,
            self.user_info,
            self.bearer_token,
            self.bearer_logical_cluster,
            self.max_retries,
            self.retries_wait_ms,
            self.timeout_s,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SchemaRegistry) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        auth = ", user_info='***'" if self.user_info else ""
        auth += ", bearer_token='***'" if self.bearer_token else ""
        return f"SchemaRegistry({safe_url(self.url)!r}{auth})"

    @property
    def shown_url(self) -> str:
        """The URL as error messages show it (no credentials)."""
        return safe_url(self.url)

    def client_config(self) -> dict[str, Any]:
        """The ``SchemaRegistryClient`` configuration (holds the credentials: never log it)."""
        conf: dict[str, Any] = {
            "url": self.url,
            "max.retries": self.max_retries,
            "retries.wait.ms": self.retries_wait_ms,
            "retries.max.wait.ms": max(self.retries_wait_ms, 20_000),
            "timeout": self.timeout_s,
        }
        if self.user_info is not None:
            conf["basic.auth.user.info"] = self.user_info.reveal()
        if self.bearer_token is not None:
            conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
            conf["bearer.auth.token"] = self.bearer_token.reveal()
            conf["bearer.auth.logical.cluster"] = self.bearer_logical_cluster
        return conf


_CLIENTS: dict[SchemaRegistry, Any] = {}
_LOCK = threading.Lock()


def registry_client(registry: SchemaRegistry) -> Any:
    """This process's ``SchemaRegistryClient`` for ``registry`` (created on first use)."""
    client = _CLIENTS.get(registry)
    if client is not None:
        return client
    from confluent_kafka.schema_registry import SchemaRegistryClient

    with _LOCK:
        client = _CLIENTS.get(registry)
        if client is None:
            try:
                client = SchemaRegistryClient.new_client(registry.client_config())
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"codec: schema registry {registry.shown_url}: {exc}") from None
            _CLIENTS[registry] = client
    return client


def schema_id_of(value: bytes, schema_type: str) -> int | None:
    """The schema id in a framed value, read by confluent-kafka's own framing code."""
    from confluent_kafka.schema_registry.common.serde import SchemaId

    try:
        found = SchemaId(schema_type)
        found.from_bytes(io.BytesIO(value))
    except Exception:
        return None
    schema_id: int | None = found.id
    return schema_id


def translate(
    exc: BaseException, value: bytes, schema_type: str, registry: str | None
) -> Exception:
    """The named error for an exception raised while deserializing ``value``.

    ``registry`` is the registry's URL as shown to users (no credentials); None when the
    values are not framed (schema from a file), so there is no schema id to name.
    """
    # confluent-kafka's own choice of HTTP library (httpx2 or httpx), whichever it uses.
    from confluent_kafka.schema_registry.common._httpx_compat import httpx
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.serialization import SerializationError

    kind = schema_type.capitalize() if schema_type != "JSON" else "JSON Schema"
    if isinstance(exc, SchemaDecodeError):
        return exc
    schema_id = schema_id_of(value, schema_type) if registry is not None else None
    if registry is None:
        sid = "the schema file"
    else:
        sid = f"schema id {schema_id}" if schema_id is not None else "the record's schema id"
    if isinstance(exc, SchemaRegistryError):
        status = exc.http_status_code
        if status == 404 and exc.error_code in (40401, 40402):
            return UnknownSchemaIdError(
                f"{sid}: the schema registry {registry} has no such subject or version "
                f"({_short(str(exc.error_message))}, error code {exc.error_code})"
            )
        if status == 404:
            return UnknownSchemaIdError(
                f"unknown {sid}: the schema registry {registry} does not hold it "
                f"(HTTP 404, error code {exc.error_code})"
            )
        if status in (401, 403):
            return RegistryUnavailableError(
                f"schema registry {registry} refused the credentials (HTTP {status}) while "
                f"fetching {sid}; check codec.registry_user_info_env / "
                "codec.registry_bearer_token_env"
            )
        return RegistryUnavailableError(
            f"schema registry {registry} failed fetching {sid} (HTTP {status}, error code "
            f"{exc.error_code}) after its retries; the batch fails and re-runs on restart"
        )
    if isinstance(exc, httpx.HTTPError):
        return RegistryUnavailableError(
            f"schema registry {registry} is unreachable ({type(exc).__name__}) fetching "
            f"{sid} after its retries; the batch fails and re-runs on restart"
        )
    text = str(exc) or type(exc).__name__
    if isinstance(exc, SerializationError):
        if "magic byte" in text.lower():
            first = value[0] if value else 0
            return WrongMagicByteError(
                f"wrong magic byte 0x{first:02x}: not a Schema Registry framed {kind} record "
                "(expected 0x00)"
            )
        if "framing" in text.lower():
            return FramingError(
                f"value of {len(value)} bytes is too short for Schema Registry framing "
                "(magic byte and 4-byte schema id)"
            )
    if type(exc).__name__ == "SchemaResolutionError":
        return UnresolvableSchemaError(
            f"writer {sid} cannot be read with the reader schema: {_short(text)}"
        )
    return MalformedPayloadError(f"invalid {kind} payload for {sid}: {_short(text)}")


def _short(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
