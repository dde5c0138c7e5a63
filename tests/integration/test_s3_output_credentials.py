"""Which key pair an ``s3://`` output in the dev S3 server's bucket uses.

Reproduced before the change: with ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` exported,
an output in the bucket of ``inorder dev up`` silently used the pair recorded in
``services.json`` instead; with that record stale, the output failed although the exported
pair was valid, and nothing said which pair had been used.

The order now is the usual AWS one: the output's ``storage_options``, then the environment,
then the dev server's record. Against the real S3 server (SeaweedFS), read back with deltalake.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from tests.fixtures.services import S3Service
from tests.fixtures.sink_cases import stage_batch

from inorder.assemble import make_sink
from inorder.endpoints import (
    ENV_ACCESS_KEY,
    ENV_S3_ENDPOINT,
    ENV_SECRET_KEY,
    ENV_STATE_DIR,
    SERVICES_FILE,
)
from inorder.errors import ConfigError
from inorder.storage import s3_objects

#: A key pair the S3 server does not know.
STALE = ("STALEKEYID0000000000", "stale-secret-0000000000")
SCHEMA = pa.schema([("topic", pa.string()), ("offset", pa.int64())])
ROWS = pa.record_batch([pa.array(["t"] * 25), pa.array(range(25), pa.int64())], schema=SCHEMA)


@pytest.fixture
def dev_store(s3: S3Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory naming the running S3 server, with a key pair it does not accept.

    As when the server's identities changed after ``services.json`` was written: an output
    that works can only have used another pair than the record's.
    """
    if s3.external:
        pytest.skip("the dev S3 server is not running: $INORDER_S3_ENDPOINT names the store")
    assert s3.state_dir is not None
    record = json.loads((s3.state_dir / SERVICES_FILE).read_text())
    record["s3"] = {**record["s3"], "access_key_id": STALE[0], "secret_access_key": STALE[1]}
    state = tmp_path / "dev-state"
    state.mkdir()
    (state / SERVICES_FILE).write_text(json.dumps(record))
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", ENV_S3_ENDPOINT):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ENV_STATE_DIR, str(state))
    s3_objects.store.cache_clear()
    return state


def _delta_spec(path: str, storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "type": "delta",
        "path": path,
        "partition_by": [],
        "storage_options": storage_options or {},
    }


def _write_and_read_back(s3: S3Service, spec: dict[str, Any]) -> int:
    """Commit one batch through the sink the pipeline file builds; rows read back."""
    sink = make_sink(spec)
    sink.check(SCHEMA)
    assert sink.commit(0, stage_batch(sink, 0, ROWS)) is True
    return (
        DeltaTable(spec["path"], storage_options=s3.storage_options()).to_pyarrow_table().num_rows
    )


def test_the_environments_key_pair_wins_over_the_dev_servers_record(
    s3: S3Service,
    dev_store: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV_ACCESS_KEY, s3.access_key_id)
    monkeypatch.setenv(ENV_SECRET_KEY, s3.secret_access_key)
    assert _write_and_read_back(s3, _delta_spec(s3.new_prefix())) == 25
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"inorder: S3 {s3.endpoint_url}: using the key pair in AWS_ACCESS_KEY_ID / "
        "AWS_SECRET_ACCESS_KEY from the environment, not the dev server's own "
        "(services.json); unset them to use that one"
    ], err
    assert s3.secret_access_key not in err and STALE[1] not in err


def test_the_outputs_storage_options_win_over_the_environment(
    s3: S3Service, dev_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_ACCESS_KEY, STALE[0])
    monkeypatch.setenv(ENV_SECRET_KEY, STALE[1])
    given = {"access_key_id": s3.access_key_id, "secret_access_key": s3.secret_access_key}
    assert _write_and_read_back(s3, _delta_spec(s3.new_prefix(), given)) == 25


def test_half_a_key_pair_is_refused_naming_the_missing_half(
    s3: S3Service, dev_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_ACCESS_KEY, s3.access_key_id)
    monkeypatch.delenv(ENV_SECRET_KEY, raising=False)
    with pytest.raises(ConfigError) as refused:
        make_sink(_delta_spec(s3.new_prefix()))
    assert str(refused.value) == (
        f"AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not: set both to use that key "
        f"pair for {s3.endpoint_url}, or unset it to use the dev server's own"
    )
    monkeypatch.delenv(ENV_ACCESS_KEY)
    with pytest.raises(ConfigError, match="go together"):
        make_sink(_delta_spec(s3.new_prefix(), {"access_key_id": s3.access_key_id}))
