"""Secrets are found by their names, never by ``key`` alone; --print-config output runs as is."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from inorder.commands.run import printable_toml
from inorder.pipeline.config import load_toml, validate
from inorder.redaction import MASK, is_secret_name, mask_secrets, redact

SECRETS = [
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.key.pem",
    "sasl.jaas.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "basic.auth.user.info",
    "bearer.auth.token",
    "aws_secret_access_key",
    "AWS_SECRET_ACCESS_KEY",
    "aws_access_key_id",
    "aws_session_token",
    "s3.secret-access-key",
    "s3.access-key-id",
    "azure_storage_account_key",
    "Authorization",
    "webhook_url",
    "credential",
]
NOT_SECRETS = [
    "row_key",
    "key",
    "partition_by",
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "ssl.key.location",
    "ssl.ca.location",
    "aws_region",
    "endpoint",
    "sequence_field",
    "topic_pattern",
    "registry_user_info_env",  # the name of the variable that holds it, not the secret
    "registry_bearer_token_env",
]


@pytest.mark.parametrize("name", SECRETS)
def test_secret_names_are_masked(name: str) -> None:
    assert is_secret_name(name)
    assert redact({name: "hunter2"}) == {name: MASK}


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_ordinary_names_are_shown(name: str) -> None:
    assert not is_secret_name(name)
    assert mask_secrets({"options": {name: "v"}}) == {"options": {name: "v"}}


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(
        """
[pipeline]
name = "masked"
checkpoint = "CK"
[source]
topic_pattern = "site-.*"
kafka = { "security.protocol" = "SASL_SSL", "sasl.username" = "u", "sasl.password" = "hunter2" }
[processor]
type = "sessions"
options = { row_key = "pk" }
[sink]
path = "s3://bucket/out"
storage_options = { aws_region = "eu-west-1", aws_secret_access_key = "hunter3" }
[notify]
webhook_url = "https://hooks.example/T000/B000/XXXX"
""".replace("CK", str(tmp_path / "ck"))
    )
    return path


def test_printable_toml_leaves_secrets_out_and_runs_as_is(tmp_path: Path) -> None:
    source = _config(tmp_path)
    config = validate(load_toml(source))
    text = printable_toml(config)
    for secret in ("hunter2", "hunter3", "XXXX", MASK):
        assert secret not in text
    assert "# omitted (secret): source.kafka.sasl.password" in text
    assert "# omitted (secret): sink.storage_options.aws_secret_access_key" in text
    assert "# omitted (secret): notify.webhook_url" in text
    printed = tomllib.loads(text)
    assert printed["processor"]["options"] == {"row_key": "pk"}  # not a secret
    assert printed["sink"]["storage_options"] == {"aws_region": "eu-west-1"}
    # The printed file is a valid pipeline file whose settings are the original's without
    # the secrets (it runs as is, with credentials from the environment).
    again = validate(printed, origin="printed")
    assert again["processor"] == config["processor"]
    assert again["source"]["kafka"] == {"security.protocol": "SASL_SSL", "sasl.username": "u"}


def test_print_config_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "inorder.cli", "run", str(_config(tmp_path)), "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "hunter" not in done.stdout + done.stderr
    assert tomllib.loads(done.stdout)["processor"]["options"]["row_key"] == "pk"
