"""S3 connection settings: explicit options first, then the usual environment variables.

The options and their environment fallbacks are listed in :mod:`inorder.storage.fs`. Secrets
never appear in ``repr``, ``str`` or error messages.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from inorder.errors import StorageError

_ALIASES: dict[str, str] = {
    "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "aws_endpoint_url": "endpoint_url",
    "aws_endpoint_url_s3": "endpoint_url",
    "aws_endpoint": "endpoint_url",
    "access_key_id": "access_key_id",
    "aws_access_key_id": "access_key_id",
    "secret_access_key": "secret_access_key",
    "aws_secret_access_key": "secret_access_key",
    "session_token": "session_token",
    "aws_session_token": "session_token",
    "region": "region",
    "aws_region": "region",
    "aws_default_region": "region",
    "allow_http": "allow_http",
    "aws_allow_http": "allow_http",
}

#: Every accepted option name, lower case (the canonical names and their aliases).
KNOWN_OPTIONS = frozenset(_ALIASES)

_ENV: dict[str, tuple[str, ...]] = {
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "allow_http": ("AWS_ALLOW_HTTP",),
}


@dataclass(frozen=True)
class S3Settings:
    """Resolved S3 connection settings. ``repr`` hides the credentials."""

    endpoint_url: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    allow_http: bool = False

    @classmethod
    def from_options(
        cls, options: Mapping[str, str] | None, env: Mapping[str, str] | None = None
    ) -> S3Settings:
        """Explicit options first, then the environment (see the module docstring)."""
        environ = os.environ if env is None else env
        given: dict[str, str] = {}
        for key, value in (options or {}).items():
            canonical = _ALIASES.get(key.lower())
            if canonical is None:
                raise StorageError(
                    f"unknown storage option {key!r}; known: "
                    + ", ".join(sorted(set(_ALIASES.values())))
                )
            given[canonical] = str(value)
        for name, variables in _ENV.items():
            if name not in given:
                for var in variables:
                    if environ.get(var):
                        given[name] = environ[var]
                        break
        endpoint = given.get("endpoint_url") or None
        allow_http_text = given.get("allow_http")
        if allow_http_text is None:
            allow_http = bool(endpoint and endpoint.startswith("http://"))
        else:
            allow_http = allow_http_text.strip().lower() in ("1", "true", "yes", "on")
        if endpoint and "://" not in endpoint:
            endpoint = ("http://" if allow_http else "https://") + endpoint
        return cls(
            endpoint_url=endpoint,
            access_key_id=given.get("access_key_id") or None,
            secret_access_key=given.get("secret_access_key") or None,
            session_token=given.get("session_token") or None,
            region=given.get("region") or "us-east-1",
            allow_http=allow_http,
        )

    def pyarrow_fs(self) -> pafs.S3FileSystem:
        """A pyarrow S3 filesystem for these settings."""
        kwargs: dict[str, object] = {"region": self.region}
        if self.endpoint_url:
            parsed = urllib.parse.urlsplit(self.endpoint_url)
            kwargs["endpoint_override"] = parsed.netloc
            kwargs["scheme"] = parsed.scheme or "https"
        if self.access_key_id and self.secret_access_key:
            kwargs["access_key"] = self.access_key_id
            kwargs["secret_key"] = self.secret_access_key
            if self.session_token:
                kwargs["session_token"] = self.session_token
        return pafs.S3FileSystem(**kwargs)

    def storage_options(self) -> dict[str, str]:
        """The same settings as deltalake / object_store ``storage_options``."""
        out: dict[str, str] = {"AWS_REGION": self.region}
        if self.endpoint_url:
            out["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.access_key_id:
            out["AWS_ACCESS_KEY_ID"] = self.access_key_id
        if self.secret_access_key:
            out["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.session_token:
            out["AWS_SESSION_TOKEN"] = self.session_token
        if self.allow_http:
            out["AWS_ALLOW_HTTP"] = "true"
        # SeaweedFS, MinIO and S3 itself support conditional PUT: delta commits need no lock.
        out["AWS_CONDITIONAL_PUT"] = "etag"
        return out
