"""A processor's documented hooks: the codec and integrity it brings, and the type overrides."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from inorder import Integrity, Pipeline, Processor
from inorder.assemble import build_pipeline
from inorder.codecs.raw import RawCodec
from inorder.errors import ConfigError
from inorder.pipeline.config import validate
from inorder.processor import Context, processor_types
from inorder.sinks.parquet import ParquetSink


@dataclass
class Msg:
    """A message."""

    k: str


@dataclass
class Count:
    """Per-key state."""

    n: int = 0


@dataclass
class Row:
    """An output row."""

    k: str


class Plain(Processor[Msg, Count, Row]):
    """No defaults of its own."""

    def key(self, msg: Msg) -> str:
        return msg.k

    def initial_state(self, key: str) -> Count:
        return Count()

    def process(self, state: Count, msg: Msg, ctx: Context) -> Iterable[Row]:
        return ()


class Opinionated(Plain):
    """Brings its own codec and integrity."""

    def default_codec(self) -> Any:
        return RawCodec()

    def default_integrity(self) -> Integrity:
        return Integrity.strict(on_violation="dead_letter")


def _pipeline(processor: Any, tmp: str, **given: Any) -> Pipeline[Any, Any, Any]:
    return Pipeline(
        source=None,  # type: ignore[arg-type]
        processor=processor,
        sink=ParquetSink(f"{tmp}/out"),
        checkpoint=f"{tmp}/cp",
        **given,
    )


def test_without_defaults_json_and_strict(tmp_path: Any) -> None:
    pipeline = _pipeline(Plain(), str(tmp_path))
    assert type(pipeline.resolved_codec()).__name__ == "JsonCodec"
    assert pipeline.resolved_integrity() == Integrity.strict()


def test_processor_defaults_are_used_and_pipeline_settings_win(tmp_path: Any) -> None:
    pipeline = _pipeline(Opinionated(), str(tmp_path))
    assert isinstance(pipeline.resolved_codec(), RawCodec)
    assert pipeline.resolved_integrity().on_violation == "dead_letter"
    given = _pipeline(Opinionated(), str(tmp_path), integrity=Integrity.none())
    assert given.resolved_integrity() == Integrity.none()


def test_toml_integrity_starts_from_the_processor_default() -> None:
    config = validate(
        {
            "source": {"topics": ["t"], "bootstrap_servers": "127.0.0.1:9"},
            "processor": {"type": f"{__name__}:Opinionated"},
            "sink": {"path": "out"},
            "integrity": {"sequence_field": "k"},
        }
    )
    pipeline = build_pipeline(config)
    assert pipeline.integrity == Integrity.strict(on_violation="dead_letter", sequence_field="k")


def test_type_overrides_win_over_generic_arguments() -> None:
    class Override(Plain):
        out_type = Msg

    assert processor_types(Override()).out is Msg
    assert processor_types(Plain()).out is Row


class NotAProcessor:
    """Has the methods but is no Processor."""

    def key(self, msg: Any) -> str:
        return ""


def test_something_that_is_not_a_processor_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r"NotAProcessor is not an inorder\.Processor"):
        _pipeline(NotAProcessor(), str(tmp_path))
    config = validate(
        {
            "source": {"topics": ["t"], "bootstrap_servers": "127.0.0.1:9"},
            "processor": {"type": f"{__name__}:NotAProcessor"},
            "sink": {"path": "out"},
        }
    )
    with pytest.raises(
        ConfigError, match=r"processor.type: .* not a subclass of inorder.Processor"
    ):
        build_pipeline(config)
