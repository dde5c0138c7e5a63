"""Pipeline file validation: each bad config gives its one intended message."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inorder.errors import ConfigError
from inorder.pipeline.config import load_toml, validate
from inorder.pipeline.settings import SECTIONS, reference_markdown

ROOT = Path(__file__).resolve().parents[2]

GOOD: dict[str, Any] = {
    "source": {"topic_pattern": "site-.*", "bootstrap_servers": "127.0.0.1:9"},
    "processor": {"type": "sessions"},
    "sink": {"path": "out"},
}


def with_(section: str, **values: Any) -> dict[str, Any]:
    config = {k: dict(v) for k, v in GOOD.items()}
    config.setdefault(section, {}).update(values)
    return config


def test_good_config_gets_defaults() -> None:
    config = validate(GOOD)
    assert config["pipeline"]["trigger"] == "10 seconds"
    assert config["sink"]["compression"] == "zstd"
    assert config["spark"]["master"] == "local[*]"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**GOOD, "sinks": {}}, r"unknown section \[sinks\] \(did you mean 'sink'\?\)"),
        (
            with_("sink", compresion="zstd"),
            r"unknown key sink.compresion \(did you mean 'compression'\?\)",
        ),
        (
            with_("source", max_offsets_per_trigger="10"),
            r"source.max_offsets_per_trigger must be an integer, not str",
        ),
        (with_("source", fail_on_data_loss="yes"), r"source.fail_on_data_loss must be a boolean"),
        (with_("sink", target_file_size=True), r"sink.target_file_size must be an integer"),
        ({k: v for k, v in GOOD.items() if k != "sink"}, r"missing required setting sink.path"),
        (
            {k: v for k, v in GOOD.items() if k != "processor"},
            r"missing required setting processor.type",
        ),
        (with_("pipeline", trigger="every minute"), r"pipeline.trigger: invalid duration"),
        (
            with_("integrity", on_violation="restart"),
            r"integrity.on_violation must be one of .*did you mean 'restart_session'",
        ),
        (with_("integrity", tier="strct"), r"integrity.tier must be one of .*did you mean"),
        (with_("source", topics=["a"]), r"exactly one of source.topic_pattern and source.topics"),
        (with_("sink", type="csv"), r"sink.type must be 'parquet', 'delta' or 'iceberg'"),
        (with_("pipeline", backend="flink"), r"pipeline.backend must be"),
        (with_("integrity", lateness="soon"), r"integrity.lateness: invalid duration"),
    ],
)
def test_bad_config_message(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(config)


def test_toml_syntax_error_names_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[source\n")
    with pytest.raises(ConfigError, match=r"p.toml: invalid TOML"):
        load_toml(path)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml("/nonexistent/pipeline.toml")


def test_reference_doc_matches_code() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert reference_markdown() in doc, "regenerate docs/configuration.md from the settings"
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", doc, flags=re.M))
    in_code = {key for settings in SECTIONS.values() for key in settings}
    assert documented == in_code


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "/nonexistent.toml"], "does not exist"),
        (["run", "--set", "nodot", "x.toml"], "--set expects SECTION.KEY=VALUE"),
        (["run", "nomodule_xyz:thing"], "cannot import module 'nomodule_xyz'"),
    ],
)
def test_cli_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    if args[1] == "--set":
        (tmp_path / "x.toml").write_text('[sink]\npath="o"\n')
        args = [args[0], args[1], args[2], str(tmp_path / "x.toml")]
    done = subprocess.run(
        [sys.executable, "-m", "inorder.cli", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_value_only_a_sink_checks_is_a_setting_error_naming_its_section() -> None:
    # Exit code 2 (a wrong setting), not 1 (a failure while running), and where it is.
    from inorder.assemble import build_pipeline

    with pytest.raises(ConfigError, match=r"^\[sink\] compression 'bogus' is not one of zstd"):
        build_pipeline(validate(with_("sink", compression="bogus")))


def test_sink_compaction_keys_reach_the_sink() -> None:
    from inorder.assemble import make_sink
    from inorder.sinks.parquet import ParquetSink

    config = validate(with_("sink", compact=True, compaction_fanout=4, compaction_levels=2))
    sink = make_sink(config["sink"])
    assert isinstance(sink, ParquetSink)
    assert (sink.compact, sink.compaction_fanout, sink.compaction_levels) == (True, 4, 2)
    assert sink.compact_in_background
    assert not make_sink(validate(GOOD)["sink"]).compact  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="compaction_fanout must be >= 2"):
        validate(with_("sink", compact=True, compaction_fanout=1))
    assert sink.compaction_max_merge_bytes == 512 * 1024 * 1024  # type: ignore[attr-defined]
    bound = validate(with_("sink", compact=True, compaction_max_merge_bytes=256 * 1024 * 1024))
    assert make_sink(bound["sink"]).compaction_max_merge_bytes == 256 * 1024 * 1024  # type: ignore[attr-defined]
    small = with_("sink", target_file_size=1000, compaction_max_merge_bytes=999)
    with pytest.raises(ConfigError, match=r"sink.compaction_max_merge_bytes must be >= sink"):
        validate(small)
    iceberg = validate(
        with_("sink", type="iceberg", table="ns.t", compact=True, compaction_fanout=3)
    )
    made = make_sink(iceberg["sink"])
    assert made.compact and made.compaction.fanout == 3  # type: ignore[attr-defined]
