"""Which setting names hold secrets, and how their values are masked wherever they are shown.

One list for every place a configuration is printed, logged, recorded or shown on a page
(``inorder run --print-config``, the checkpoint's recorded settings, the source options that
travel in task specs, the status page). Names are matched by the words that mark a credential
in the libraries inorder passes settings to (librdkafka, the schema registry client, object
stores, pyiceberg catalogs, HTTP headers), never by ``key`` alone: ``row_key`` or
``partition.key`` are not secrets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: What a masked secret is shown as.
MASK = "***"

#: Words that mark a secret, matched in the lowercased name with ``-`` and ``.`` read as ``_``.
_SECRET_WORDS = (
    "password",
    "passwd",
    "secret",  # aws_secret_access_key, client.secret, s3.secret-access-key
    "token",  # session tokens, bearer tokens, SAS tokens
    "credential",
    "access_key",  # aws_access_key_id, s3.access-key-id
    "accesskey",
    "account_key",  # Azure storage account keys
    "api_key",
    "apikey",
    "private",  # private keys
    "jaas",  # sasl.jaas.config carries the password
    "key_pem",  # ssl.key.pem: the client's private key itself
    "user_info",  # the schema registry's basic.auth.user.info is "user:password"
    "userinfo",
    "oauthbearer_config",
    "authorization",  # HTTP headers (notify.headers)
    "cookie",
    "webhook_url",  # chat webhooks carry their secret in the URL
)


def is_secret_name(name: str) -> bool:
    """Whether a setting named ``name`` holds a secret (its value is never shown)."""
    normal = name.lower().replace("-", "_").replace(".", "_")
    if normal.endswith("_env"):  # names the environment variable that holds the secret
        return False
    return any(word in normal for word in _SECRET_WORDS)


def mask_secrets(value: Any, name: str = "") -> Any:
    """``value`` with every secret-named entry (at any depth) replaced by :data:`MASK`."""
    if name and is_secret_name(name):
        return MASK
    if isinstance(value, Mapping):
        return {str(k): mask_secrets(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_secrets(v) for v in value]
    return value


def redact(conf: Mapping[str, str]) -> dict[str, str]:
    """A copy of a flat configuration (e.g. librdkafka's) with secret values masked."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in conf.items()}
