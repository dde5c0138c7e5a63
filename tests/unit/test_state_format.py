"""A state directory written by a newer release is refused by name, never read as empty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inorder.errors import ConfigError
from inorder.state.checkpoint import STATE_FORMAT, CheckpointStore


def test_state_of_a_newer_format_is_refused_with_its_file_named(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    assert store.state_meta() is None
    created = store.init_state_meta({"format": 1})
    assert created["format"] == STATE_FORMAT and store.state_meta() == created
    meta = tmp_path / "ckpt" / "state" / "_meta.json"
    for newer in (STATE_FORMAT + 1, "2"):
        meta.write_text(json.dumps({**created, "format": newer}))
        with pytest.raises(ConfigError) as caught:
            store.state_meta()
        message = str(caught.value)
        assert str(meta) in message and repr(newer) in message
        assert "newer release" in message and f"format {STATE_FORMAT} and earlier" in message


def test_state_meta_of_the_first_releases_has_no_format_and_is_read(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    created = store.init_state_meta({"format": 1})
    meta = tmp_path / "ckpt" / "state" / "_meta.json"
    meta.write_text(json.dumps({k: v for k, v in created.items() if k != "format"}))
    assert store.state_meta() == {k: v for k, v in created.items() if k != "format"}
