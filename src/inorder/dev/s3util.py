"""A minimal S3 client over ``http.client``, signed with AWS Signature Version 4.

Only what the dev services and their checks need: list buckets, create/head a bucket, put an
object (optionally conditional, ``If-None-Match: *``), get and delete an object. boto3 is not
a dependency, and pyarrow's S3 filesystem cannot send conditional headers, so this signs
requests itself (path-style addressing, payload hash included).

Credentials are used to sign and never end up in exceptions or reprs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from inorder.errors import InorderError

#: Unreserved characters of RFC 3986 stay as they are in canonical URIs (SigV4 rule).
_SAFE = "-_.~"


class S3RequestError(InorderError):
    """An S3 request could not be sent or got an unexpected answer."""


@dataclass(frozen=True)
class S3Credentials:
    """Where an S3 server is and how to sign for it (the secret is kept out of ``repr``)."""

    endpoint_url: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    region: str = "us-east-1"


@dataclass(frozen=True)
class S3Response:
    """Status, headers (lower-cased names) and body of one S3 answer."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def error_code(self) -> str:
        """The ``<Code>`` of an S3 XML error body, or ``""``."""
        match = re.search(rb"<Code>([^<]+)</Code>", self.body)
        return match.group(1).decode("utf-8", "replace") if match else ""


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def sign_headers(
    creds: S3Credentials,
    method: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    body: bytes,
    now: dt.datetime | None = None,
) -> dict[str, str]:
    """Return ``headers`` plus the SigV4 ``Authorization``, ``x-amz-date`` and payload hash.

    ``path`` is the unencoded object path (``/bucket/key``); ``host`` is taken from the
    endpoint URL.
    """
    parsed = urllib.parse.urlsplit(creds.endpoint_url)
    when = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    date = when[:8]
    payload_hash = hashlib.sha256(body).hexdigest()
    signed: dict[str, str] = {k.lower(): str(v).strip() for k, v in headers.items()}
    signed["host"] = parsed.netloc
    signed["x-amz-date"] = when
    signed["x-amz-content-sha256"] = payload_hash
    names = sorted(signed)
    canonical_query = "&".join(
        f"{urllib.parse.quote(k, safe=_SAFE)}={urllib.parse.quote(v, safe=_SAFE)}"
        for k, v in sorted(query.items())
    )
    canonical = "\n".join(
        [
            method,
            urllib.parse.quote(path, safe="/" + _SAFE),
            canonical_query,
            "".join(f"{n}:{signed[n]}\n" for n in names),
            ";".join(names),
            payload_hash,
        ]
    )
    scope = f"{date}/{creds.region}/s3/aws4_request"
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            when,
            scope,
            hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        ]
    )
    key = _hmac(("AWS4" + creds.secret_access_key).encode("utf-8"), date)
    for part in (creds.region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds.access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return signed


def request(
    creds: S3Credentials,
    method: str,
    path: str = "/",
    *,
    query: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    body: bytes = b"",
    timeout: float = 10.0,
) -> S3Response:
    """Send one signed request; raise :class:`S3RequestError` only if it cannot be sent."""
    parsed = urllib.parse.urlsplit(creds.endpoint_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise S3RequestError(f"invalid S3 endpoint URL {creds.endpoint_url!r}")
    query = dict(query or {})
    all_headers = sign_headers(creds, method, path, query, dict(headers or {}), body)
    target = urllib.parse.quote(path, safe="/" + _SAFE)
    if query:
        target += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote, safe=_SAFE)
    conn_cls = (
        http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_cls(parsed.hostname, parsed.port, timeout=timeout)
    try:
        all_headers.pop("host", None)  # http.client adds Host itself (same value)
        conn.request(method, target, body=body, headers=all_headers)
        resp = conn.getresponse()
        data = resp.read()
        return S3Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    except (OSError, http.client.HTTPException) as exc:
        raise S3RequestError(
            f"S3 {method} to {creds.endpoint_url} failed: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        conn.close()


def list_buckets(creds: S3Credentials, timeout: float = 10.0) -> list[str]:
    """Names of the buckets the credentials can see (ListBuckets)."""
    resp = request(creds, "GET", "/", timeout=timeout)
    if resp.status != 200:
        raise S3RequestError(
            f"S3 ListBuckets at {creds.endpoint_url} answered HTTP {resp.status} "
            f"{resp.error_code()}".rstrip()
        )
    return [m.decode() for m in re.findall(rb"<Name>([^<]+)</Name>", resp.body)]


def bucket_exists(creds: S3Credentials, bucket: str, timeout: float = 10.0) -> bool:
    """True if HEAD bucket answers 200, False on 404; other answers raise."""
    resp = request(creds, "HEAD", f"/{bucket}", timeout=timeout)
    if resp.status == 200:
        return True
    if resp.status == 404:
        return False
    raise S3RequestError(f"S3 HEAD bucket {bucket!r} answered HTTP {resp.status}")


def create_bucket(creds: S3Credentials, bucket: str, timeout: float = 10.0) -> bool:
    """Create ``bucket``; return False if it already existed (owned by these credentials)."""
    body = b""
    if creds.region != "us-east-1":
        # AWS requires the location constraint outside us-east-1; SeaweedFS ignores it.
        body = (
            "<CreateBucketConfiguration><LocationConstraint>"
            f"{creds.region}</LocationConstraint></CreateBucketConfiguration>"
        ).encode()
    resp = request(creds, "PUT", f"/{bucket}", body=body, timeout=timeout)
    if resp.status == 200:
        return True
    if resp.status == 409 and resp.error_code() == "BucketAlreadyOwnedByYou":
        return False
    raise S3RequestError(
        f"creating S3 bucket {bucket!r} answered HTTP {resp.status} {resp.error_code()}".rstrip()
    )


def put_object(
    creds: S3Credentials,
    bucket: str,
    key: str,
    body: bytes,
    *,
    if_none_match: bool = False,
    timeout: float = 10.0,
) -> S3Response:
    """PUT an object; with ``if_none_match`` only if no object exists under the key.

    Returns the response as is: 200 on success, 412 (PreconditionFailed) when a conditional
    put finds an existing object. Callers decide what a non-200 means for them.
    """
    headers = {"if-none-match": "*"} if if_none_match else {}
    return request(creds, "PUT", f"/{bucket}/{key}", headers=headers, body=body, timeout=timeout)


def get_object(creds: S3Credentials, bucket: str, key: str, timeout: float = 10.0) -> S3Response:
    """GET an object (the response as is; 404 when missing)."""
    return request(creds, "GET", f"/{bucket}/{key}", timeout=timeout)


def delete_object(creds: S3Credentials, bucket: str, key: str, timeout: float = 10.0) -> S3Response:
    """DELETE an object (the response as is; 204 on success)."""
    return request(creds, "DELETE", f"/{bucket}/{key}", timeout=timeout)
