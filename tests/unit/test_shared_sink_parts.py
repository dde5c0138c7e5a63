"""The pieces the Parquet and Delta sinks, compaction and output repair share."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from inorder.checkpoint.layout import CheckpointLayout
from inorder.errors import InorderError
from inorder.sinks.compaction_records import StagedRecord, remove_replaced
from inorder.sinks.delta import DeltaSink
from inorder.sinks.parquet import ParquetSink
from inorder.storage import fs as sfs

TABLE = pa.table({"offset": pa.array([1, 2, 3], pa.int64())})


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_record_that_fails_before_its_commit_leaves_nothing(tmp_path: Path) -> None:
    location = sfs.resolve(str(tmp_path))
    with pytest.raises(RuntimeError), StagedRecord(location, "repair", 3, "zstd") as record:
        record.stage(TABLE, "topic=a", "repaired-0000000003-00000", {"topic": "a"})
        assert record.staging.startswith("_inorder/staging/r3-")
        assert len(_files(tmp_path)) == 1
        raise RuntimeError("killed")
    assert _files(tmp_path) == []


def test_a_committed_record_is_published_and_marked_done(tmp_path: Path) -> None:
    location = sfs.resolve(str(tmp_path))
    (tmp_path / "old.parquet").write_bytes(b"x")
    with StagedRecord(location, "compaction", 0, "zstd") as record:
        record.stage(TABLE, "", "compacted-0000000000-00000", {})
        rel = record.commit(["old.parquet"], taken=InorderError("taken"), extra=1)
    assert rel == "_inorder/compactions/00000000000000000000.json"
    manifest = json.loads((tmp_path / rel).read_text())
    assert list(manifest) == ["format", "kind", "seq", "created_at", "extra", "replaces", "files"]
    assert manifest["kind"] == "compaction" and manifest["replaces"] == ["old.parquet"]
    assert manifest["files"][0]["final"] == "compacted-0000000000-00000.parquet"
    assert manifest["files"][0]["rows"] == 3
    assert (tmp_path / "_inorder/compactions/00000000000000000000.done").exists()
    assert not [f for f in _files(tmp_path) if f.startswith("_inorder/staging")]
    remove_replaced(location, 0, ["old.parquet"])
    assert not (tmp_path / "old.parquet").exists()
    assert (tmp_path / "_inorder/compactions/00000000000000000000.cleaned").exists()


def test_a_taken_seq_raises_the_callers_error_and_keeps_the_winner(tmp_path: Path) -> None:
    location = sfs.resolve(str(tmp_path))
    winner = tmp_path / "_inorder/compactions/00000000000000000005.json"
    winner.parent.mkdir(parents=True)
    winner.write_text("{}")
    with (
        pytest.raises(InorderError, match="lost"),
        StagedRecord(location, "repair", 5, "zstd") as record,
    ):
        record.stage(TABLE, "", "repaired-0000000005-00000", {})
        record.commit([], taken=InorderError("lost"))
    assert _files(tmp_path) == ["_inorder/compactions/00000000000000000005.json"]
    assert winner.read_text() == "{}"


def test_a_failure_after_the_commit_keeps_the_staged_files(tmp_path: Path) -> None:
    location = sfs.resolve(str(tmp_path))
    with pytest.raises(RuntimeError), StagedRecord(location, "compaction", 1, "zstd") as record:
        record.stage(TABLE, "", "compacted-0000000001-00000", {})
        record.commit([], taken=InorderError("taken"))
        raise RuntimeError("after the commit point")
    files = _files(tmp_path)
    assert "_inorder/compactions/00000000000000000001.json" in files
    assert any(f.startswith("_inorder/staging/c1-") for f in files)


@pytest.mark.parametrize("kind", [ParquetSink, DeltaSink])
def test_file_sinks_pickle_without_their_location_and_sit_beside(
    kind: type[ParquetSink] | type[DeltaSink], tmp_path: Path
) -> None:
    sink = kind(str(tmp_path / "out/"), ["topic"], compression="snappy")
    assert sink.location.root == str(tmp_path / "out")
    copy = pickle.loads(pickle.dumps(sink))
    assert copy._location is None and copy.path == sink.path
    assert repr(sink) == f"{kind.__name__}({sink.path!r}, partition_by=['topic'])"
    beside = sink.beside("_dead_letter", [])
    assert type(beside) is kind
    assert beside.path == str(tmp_path / "out") + "_dead_letter"
    assert beside.compression == "snappy" and beside.partition_by == []
    with pytest.raises(InorderError, match="compression 'lzo'"):
        kind(str(tmp_path), compression="lzo")


def test_planned_batches_are_the_numbered_files_of_sparks_offsets_log(tmp_path: Path) -> None:
    layout = CheckpointLayout.of(f"{tmp_path}/")
    assert layout.spark_dir == f"{tmp_path}/spark" and layout.engine_dir == f"{tmp_path}/engine"
    assert layout.planned_batches() == []
    offsets = tmp_path / "spark" / "offsets"
    offsets.mkdir(parents=True)
    for name in ("10", "2", ".2.crc", "tmp"):
        (offsets / name).write_text("v1")
    assert layout.planned_batches() == [2, 10]
