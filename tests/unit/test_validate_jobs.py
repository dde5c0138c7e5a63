"""``inorder validate --jobs``: a whole number of at least 1; two processes by default."""

from __future__ import annotations

import pytest

from inorder.cli import build_parser
from inorder.commands.validate import default_jobs


def test_jobs_is_parsed_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["validate", "p.toml", "--jobs", "3"]).jobs == 3
    assert parser.parse_args(["validate", "p.toml"]).jobs is None  # then default_jobs()
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["validate", "p.toml", "--jobs", bad])
        assert exited.value.code == 2
        assert "--jobs" in capsys.readouterr().err


def test_two_processes_by_default_one_on_a_single_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert default_jobs() == 2
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert default_jobs() == 1
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert default_jobs() == 1
