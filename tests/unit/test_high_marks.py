"""The file of last-seen ends: its form, and that a bad file only costs the count."""

from __future__ import annotations

from pathlib import Path

from inorder.kafka.high_marks import encode_high_marks, load_high_marks, save_high_marks
from inorder.records import TopicPartition

HIGHS = {
    TopicPartition("site-a", 0): 120,
    TopicPartition("site-a", 3): 7,
    TopicPartition("b", 1): 0,
}


def test_saved_ends_load_back(tmp_path: Path) -> None:
    path = str(tmp_path / "highs.json")
    assert load_high_marks(path) == {}  # no file yet: nothing known
    assert save_high_marks(path, HIGHS)
    assert load_high_marks(path) == HIGHS
    assert encode_high_marks(HIGHS) == (tmp_path / "highs.json").read_bytes()


def test_an_unreadable_or_foreign_file_is_nothing_known(tmp_path: Path) -> None:
    bad = tmp_path / "highs.json"
    for text in (
        "{not json",
        '{"version": 99, "highs": {}}',
        "[]",
        '{"version": 1, "highs": {"t": {"x": 1}}}',
    ):
        bad.write_text(text)
        assert load_high_marks(str(bad)) == {}, text


def test_a_write_that_fails_does_not_raise(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert not save_high_marks(str(blocked / "highs.json"), HIGHS)  # parent is a file
