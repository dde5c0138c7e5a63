"""The class archive cache keeps one archive per Spark installation in use."""

from __future__ import annotations

import os
import time
from pathlib import Path

from inorder.pipeline.class_archive import JARS_SUFFIX, prune_archives


def _archive(folder: Path, name: str, jars: Path | None) -> Path:
    path = folder / f"spark-4.3.0-{name}.jsa"
    path.write_bytes(b"archive")
    if jars is not None:
        path.with_name(path.name + JARS_SUFFIX).write_text(f"{jars}\n")
    return path


def test_archives_of_gone_installations_are_removed(tmp_path: Path) -> None:
    cache = tmp_path / "jvm"
    cache.mkdir()
    live_jars = tmp_path / "venv-a" / "jars"
    live_jars.mkdir(parents=True)
    gone_link = tmp_path / "home-b-jars"
    gone_link.symlink_to(tmp_path / "deleted-venv" / "jars")  # a home whose venv was removed
    new = _archive(cache, "new", live_jars)
    live = _archive(cache, "live", live_jars)
    gone = _archive(cache, "gone", tmp_path / "venv-c" / "jars")
    dangling = _archive(cache, "dangling", gone_link)
    unrecorded = _archive(cache, "old", None)
    fresh_tmp = cache / f"{new.name}.123.tmp"
    stale_tmp = cache / f"{new.name}.456.tmp"
    for leftover in (fresh_tmp, stale_tmp):
        leftover.write_bytes(b"partial")
    two_days_ago = time.time() - 2 * 86_400
    os.utime(stale_tmp, (two_days_ago, two_days_ago))

    removed = prune_archives(cache, keep=new)

    assert sorted(removed) == sorted([gone, dangling, stale_tmp])
    assert new.exists() and live.exists() and unrecorded.exists() and fresh_tmp.exists()
    assert not gone.with_name(gone.name + JARS_SUFFIX).exists()
    assert not dangling.exists()


def test_the_kept_archive_stays_even_when_its_record_is_gone(tmp_path: Path) -> None:
    keep = _archive(tmp_path, "keep", tmp_path / "nowhere")
    assert prune_archives(tmp_path, keep=keep) == []
    assert keep.exists()
