"""A state directory written by a newer release is refused by name, never read as empty;
one of an older format is raised to this release's before it writes state files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inorder.errors import ConfigError
from inorder.records import TopicPartition
from inorder.state.checkpoint import (
    STATE_FORMAT,
    WRITTEN_FORMAT,
    CheckpointStore,
    VersionFile,
    parse_version_file,
)


def test_state_of_a_newer_format_is_refused_with_its_file_named(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    assert store.state_meta() is None
    created = store.init_state_meta({"format": 1})
    assert created["format"] == WRITTEN_FORMAT and store.state_meta() == created
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


def test_this_release_writes_format_2_reads_3_and_refuses_4_by_name(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    assert STATE_FORMAT == 3 and store.init_state_meta({})["format"] == 2
    meta = tmp_path / "ckpt" / "state" / "_meta.json"
    # Task files (format 3) only where the pipeline asks for them; never lowered again.
    raised = store.adopt_state_meta(json.loads(meta.read_text()), state_format=3)
    assert raised["format"] == 3 == json.loads(meta.read_text())["format"]
    assert store.adopt_state_meta(raised) == raised and store.state_meta() == raised
    meta.write_text(json.dumps({**raised, "format": 4}))
    with pytest.raises(ConfigError, match=r"its state is of format 4 .* run the newer release"):
        store.state_meta()


@pytest.mark.parametrize("older", [1, None])
def test_an_older_format_is_raised_before_state_files_are_written(
    tmp_path: Path, older: int | None
) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    created = store.init_state_meta({"fields": ["n"]})
    meta = tmp_path / "ckpt" / "state" / "_meta.json"
    first = {k: v for k, v in created.items() if k != "format"}
    meta.write_text(json.dumps(first if older is None else {**first, "format": older}))
    found = store.state_meta()
    assert found is not None
    adopted = store.adopt_state_meta(found)
    # Epoch and fingerprint kept: caches stay valid and the type check sees the same type.
    assert adopted == {**first, "format": 2} == json.loads(meta.read_text())
    assert store.state_meta() == adopted
    before = meta.stat().st_mtime_ns
    assert store.adopt_state_meta(adopted) == adopted and meta.stat().st_mtime_ns == before


def test_state_file_names_of_both_encodings_are_version_files() -> None:
    assert parse_version_file(f"{7:020d}.delta.{'a' * 12}.arrow.zstd", "p") == VersionFile(
        7, "delta", "p", "a" * 12
    )
    assert parse_version_file(f"{7:020d}.snapshot.parquet", "p") == VersionFile(7, "snapshot", "p")
    assert parse_version_file(f"{-1:020d}.snapshot.arrow.zstd", "p") == VersionFile(
        -1, "snapshot", "p"
    )
    for other in (
        f"{7:020d}.delta.feather",
        f"{7:020d}.delta.arrow.zstd.tmp",
        f"{7:020d}.delta.arrow",
        ".tmp-0123abcd",
    ):
        assert parse_version_file(other, "p") is None
    store = CheckpointStore("/ckpt")
    assert store.file_path(TopicPartition("t", 0), 7, "delta", "b" * 12).endswith(
        f"/state/t/0/{7:020d}.delta.{'b' * 12}.arrow.zstd"
    )
