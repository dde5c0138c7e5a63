"""Small objects on S3 (manifests, commit markers, probes) through obstore.

Commits need one operation pyarrow's S3 filesystem cannot do: create an object only if none
exists (``PUT`` with ``If-None-Match: *``). obstore (Rust ``object_store``) does it with
``put(..., mode="create")`` and signs with every AWS credential provider: static keys,
``AWS_SESSION_TOKEN``, web identity (EKS IRSA), container credentials (ECS, EKS Pod Identity)
and the instance profile (EC2, EMR). Data files still go through pyarrow, which uses the AWS
SDK's default chain; both read the same ``AWS_*`` environment.

Failures become one :class:`~inorder.errors.StorageError` line that names what really failed
(DNS, refused connection, timeout, missing bucket, denied access, bad signature), judged from
obstore's typed errors and the S3 error code, never from text that may contain a bucket name.
"""

from __future__ import annotations

import datetime as _dt
import functools
import urllib.parse
from collections.abc import Callable
from typing import TypeVar

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from inorder.errors import StorageError
from inorder.storage.s3_settings import S3Settings

T = TypeVar("T")

# Transient failures (throttling, 5xx, dropped connections) are retried inside one call for up
# to a minute; a name that does not resolve fails after a few seconds, not minutes.
_RETRY = {
    "max_retries": 6,
    "retry_timeout": _dt.timedelta(seconds=60),
    "backoff": {"init_backoff": _dt.timedelta(milliseconds=100), "base": 2},
}


class ObjectExists(Exception):
    """A create-only put found an object at that name."""


@functools.lru_cache(maxsize=64)
def store(settings: S3Settings, bucket: str) -> S3Store:
    """The obstore client of one bucket (built once per process and bucket)."""
    kwargs: dict[str, object] = {"region": settings.region}
    if settings.endpoint_url:
        kwargs["endpoint"] = settings.endpoint_url
        # S3-compatible servers (SeaweedFS, MinIO) address buckets by path, not by host name.
        kwargs["virtual_hosted_style_request"] = False
    if settings.access_key_id and settings.secret_access_key:
        kwargs["access_key_id"] = settings.access_key_id
        kwargs["secret_access_key"] = settings.secret_access_key
        if settings.session_token:
            kwargs["session_token"] = settings.session_token
    client = {"allow_http": settings.allow_http, "connect_timeout": _dt.timedelta(seconds=10)}
    return S3Store(bucket, client_options=client, retry_config=_RETRY, **kwargs)  # type: ignore[arg-type]


def _call_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the failure of an obstore call, not Ctrl-C or an exit.

    A panic inside obstore (Rust) arrives as pyo3's ``PanicException``, a ``BaseException``
    (seen: a credentials token file ending in a newline); it is one more failure to report.
    """
    return isinstance(exc, Exception) or type(exc).__name__ == "PanicException"


def _call(
    operation: str,
    settings: S3Settings,
    path: str,
    call: Callable[[S3Store, str], T],
    missing_key_ok: bool = False,
) -> T | None:
    """Run one obstore ``call`` on ``bucket/key``, its failures turned into one line.

    A create-only put that finds the object raises :class:`ObjectExists`. With
    ``missing_key_ok`` a missing key gives ``None``; a missing bucket is always an error.
    """
    bucket, _, key = path.partition("/")
    try:
        return call(store(settings, bucket), key)
    except (AlreadyExistsError, PreconditionError):
        raise ObjectExists(path) from None
    except FileNotFoundError as exc:
        if missing_key_ok and _s3_code(exc) != "NoSuchBucket":
            return None
        raise failure(operation, settings, path, exc) from None
    except BaseException as exc:
        if not _call_failed(exc):
            raise
        raise failure(operation, settings, path, exc) from None


def put_if_absent(settings: S3Settings, path: str, data: bytes) -> None:
    """Create ``bucket/key`` holding ``data`` unless it exists (:class:`ObjectExists`).

    One ``PUT`` with ``If-None-Match: *``: the object appears whole or not at all.
    """
    _call("PUT", settings, path, lambda s, key: obstore.put(s, key, data, mode="create"))


def put(settings: S3Settings, path: str, data: bytes) -> None:
    """Write ``bucket/key`` (replacing what is there) in one ``PUT``."""
    _call("PUT", settings, path, lambda s, key: obstore.put(s, key, data))


def get_if_exists(settings: S3Settings, path: str) -> bytes | None:
    """The content of ``bucket/key``, ``None`` if no such key (a missing bucket is an error)."""
    read = lambda s, key: bytes(obstore.get(s, key).bytes())  # noqa: E731
    return _call("GET", settings, path, read, missing_key_ok=True)


def delete_if_exists(settings: S3Settings, path: str) -> None:
    """Delete ``bucket/key``; no error when it does not exist (a missing bucket is one)."""
    _call("DELETE", settings, path, obstore.delete, missing_key_ok=True)


def check_conditional_writes(settings: S3Settings, path: str) -> None:
    """Refuse a store that ignores ``If-None-Match: *`` (exactly-once commits depend on it).

    Writes ``path`` twice in create mode: the second write must be refused. The probe object
    is deleted afterwards.
    """
    put_if_absent(settings, path, b"probe")
    try:
        put_if_absent(settings, path, b"probe again")
    except ObjectExists:
        return
    finally:
        delete_if_exists(settings, path)
    endpoint = settings.endpoint_url or f"AWS S3 ({settings.region})"
    raise StorageError(
        f"{endpoint} ignored a conditional write (PUT If-None-Match: *) to s3://{path}: "
        "exactly-once commits need an S3 store that refuses to overwrite on it (AWS S3, "
        "MinIO, SeaweedFS and Ceph do); inorder will not commit to one that does not"
    )


def _s3_code(exc: BaseException) -> str | None:
    """The ``<Code>`` of the S3 error response in an obstore error, if it carries one."""
    text = str(exc)
    start = text.find("<Code>")
    end = text.find("</Code>", start)
    return text[start + 6 : end] if start >= 0 and end > start else None


def failure(operation: str, settings: S3Settings, path: str, exc: BaseException) -> StorageError:
    """One line saying what failed for ``operation`` on ``bucket/key``, without secrets."""
    endpoint = settings.endpoint_url or f"https://s3.{settings.region}.amazonaws.com"
    bucket = path.partition("/")[0]
    code = _s3_code(exc)
    text = str(exc)
    if code == "NoSuchBucket":
        reason = f"bucket {bucket!r} does not exist at {endpoint}"
    elif code == "SignatureDoesNotMatch":
        reason = "request signature rejected (check the secret access key)"
    elif code in ("InvalidAccessKeyId", "InvalidToken", "ExpiredToken") or isinstance(
        exc, UnauthenticatedError
    ):
        reason = f"credentials rejected ({code or 'unauthenticated'}): check the AWS credentials"
    elif isinstance(exc, PermissionDeniedError) or code == "AccessDenied":
        reason = f"access denied to s3://{bucket} (check the credentials' permissions)"
    elif "dns error" in text or "failed to lookup address" in text:
        host = urllib.parse.urlsplit(endpoint).hostname
        reason = f"cannot resolve the S3 endpoint's host name {host!r} (DNS) for {endpoint}"
    elif "Connection refused" in text or "ConnectionRefused" in text:
        reason = f"connection refused by {endpoint} (is the S3 server running?)"
    elif "timed out" in text.lower() or "TimedOut" in text:
        reason = f"{endpoint} did not answer in time"
    elif code:
        reason = f"S3 error {code}"
    else:
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        reason = first
    for secret in (settings.secret_access_key, settings.session_token):
        if secret:
            reason = reason.replace(secret, "***")
    return StorageError(f"S3 {operation} s3://{path} failed: {reason}")


__all__ = [
    "ObjectExists",
    "check_conditional_writes",
    "delete_if_exists",
    "failure",
    "get_if_exists",
    "put",
    "put_if_absent",
    "store",
]
