"""Materialization settings: TOML section, Python API, and the errors for what does not fit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inorder.assemble import build_pipeline
from inorder.errors import ConfigError
from inorder.kafka.api import KafkaSource
from inorder.pipeline.config import validate
from inorder.pipeline.pipeline import Pipeline
from inorder.sessions import SessionTables
from inorder.sessions.materializer import check_materialization, pipeline_materializer
from inorder.sessions.table_book import PERIODIC, ChangeRow, TableBook, due
from inorder.sinks.delta import DeltaSink
from inorder.sinks.parquet import ParquetSink

GOOD: dict[str, Any] = {
    "source": {"topic_pattern": "site-.*", "bootstrap_servers": "127.0.0.1:9"},
    "processor": {"type": "sessions"},
    "sink": {"path": "out", "type": "delta"},
}


def with_materialized(**values: Any) -> dict[str, Any]:
    return {**GOOD, "materialized": values}


def test_materialized_section_builds_a_second_sink() -> None:
    pipeline = build_pipeline(validate(with_materialized(every=5, path="tables")))
    assert pipeline.materialize_every == 5
    assert isinstance(pipeline.materialized, DeltaSink)  # the [sink] type by default
    assert pipeline.materialized.path == "tables"
    assert pipeline.materialized.partition_by == ["topic"]
    plain = build_pipeline(
        validate(with_materialized(every=1, path="t2", type="parquet", partition_by=[]))
    )
    assert isinstance(plain.materialized, ParquetSink) and plain.materialized.partition_by == []
    assert build_pipeline(validate(GOOD)).materialized is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"every": 3}, r"materialized.every is set but materialized.path is not"),
        ({"path": "tables"}, r"materialized.every must be an integer >= 1"),
        ({"path": "tables", "every": -2}, r"materialized.every must be an integer >= 1"),
        ({"path": "tables", "every": 2, "type": "csv"}, r"materialized.type must be"),
        ({"path": "out", "every": 2}, r"materialized.path must differ from sink.path"),
        ({"path": "tables", "every": "2"}, r"materialized.every must be an integer"),
    ],
)
def test_bad_materialized_settings(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(with_materialized(**values))


def test_materialized_needs_the_session_processor() -> None:
    config = with_materialized(every=2, path="tables")
    config["processor"] = {"type": "examples.typed_processor:RunningMean"}
    with pytest.raises(ConfigError, match="only session-table pipelines"):
        build_pipeline(validate(config))


def test_python_api_checks(tmp_path: Path) -> None:
    sink = ParquetSink(str(tmp_path / "t"))
    with pytest.raises(ConfigError, match="materialize_every is set but there is no"):
        check_materialization(SessionTables(), None, 3)
    with pytest.raises(ConfigError, match=r"materialize_every \(N batches\) is not set"):
        check_materialization(SessionTables(), sink, None)
    with pytest.raises(ConfigError, match="must be an integer >= 1, not 0"):
        check_materialization(SessionTables(), sink, 0)
    with pytest.raises(ConfigError, match="only session-table pipelines"):
        check_materialization(object(), sink, 2)
    same = Pipeline(
        source=KafkaSource(bootstrap_servers="127.0.0.1:9", topic_pattern="x"),
        processor=SessionTables(),
        sink=ParquetSink(str(tmp_path / "out")),
        checkpoint=str(tmp_path / "cp"),
        materialized=ParquetSink(str(tmp_path / "out")),
        materialize_every=2,
    )
    with pytest.raises(ConfigError, match="is the change log itself"):
        pipeline_materializer(same)


def test_cli_exits_2_on_a_bad_materialized_setting(tmp_path: Path) -> None:
    toml = tmp_path / "p.toml"
    toml.write_text(
        '[source]\ntopic_pattern = "x"\nbootstrap_servers = "127.0.0.1:9"\n'
        '[processor]\ntype = "sessions"\n[sink]\npath = "out"\n'
        '[materialized]\npath = "tables"\nevery = 0\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "inorder.cli", "run", str(toml)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "materialized.every must be an integer >= 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_table_book_drops_ended_and_reset_sessions() -> None:
    def row(offset: int, op: str, rid: str | None = None, session: str = "s") -> ChangeRow:
        return ChangeRow("t", 0, offset, session, offset, op, rid, rid and f"v{offset}")

    book = TableBook()
    changes = [row(0, "clear"), row(0, "insert", "a"), row(1, "update", "a"), row(2, "end")]
    changes += [row(3, "clear", None, "u"), row(3, "insert", "b", "u"), row(4, "reset", None, "u")]
    changes += [row(5, "clear", None, "w"), row(6, "insert", "c", "w"), row(7, "delete", "c", "w")]
    dropped = book.apply(changes)
    assert [(m.session, m.reason, m.table.rows, m.table.offset) for m in dropped] == [
        ("s", "end", {"a": "v1"}, 2),
        ("u", "reset", {}, 4),
    ]
    assert [(m.session, m.reason, m.table.rows) for m in book.periodic()] == [("w", PERIODIC, {})]
    assert [due(b, 3) for b in range(6)] == [False, False, True, False, False, True]
