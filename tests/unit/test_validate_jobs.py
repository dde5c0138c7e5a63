"""``inorder validate --jobs``: a whole number of at least 1; one process by default."""

from __future__ import annotations

import pytest

from inorder.cli import build_parser


def test_jobs_is_parsed_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["validate", "p.toml", "--jobs", "3"]).jobs == 3
    assert parser.parse_args(["validate", "p.toml"]).jobs == 1  # memory first
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["validate", "p.toml", "--jobs", bad])
        assert exited.value.code == 2
        assert "--jobs" in capsys.readouterr().err
