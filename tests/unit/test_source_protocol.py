"""Sources behind one protocol, the archive reached through it, one marker-row format."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from inorder import Pipeline, Processor
from inorder.archive import TieredSource
from inorder.archive.tiered_source import TieredOptions
from inorder.assemble import build_pipeline
from inorder.engine.task import _markers
from inorder.errors import ConfigError
from inorder.kafka.api import KafkaSource
from inorder.kafka.consumer import markers_batch
from inorder.kafka.markers import (
    MARKER_HEADER,
    decode_range,
    encode_range,
    is_marker_json,
    marker_rows,
    parse_marker,
)
from inorder.kafka.source_protocol import KafkaReader, RangeReader, Source, range_reader
from inorder.pipeline.config import validate
from inorder.processor import Context
from inorder.records import TopicPartition
from inorder.sinks.parquet import ParquetSink
from inorder.testing.memory import partition_table


@dataclass
class Msg:
    """A message."""

    k: str


class Counter(Processor[Msg, int, Msg]):
    """Nothing to do: the tests only build pipelines."""

    def key(self, msg: Msg) -> str:
        return msg.k

    def initial_state(self, key: str) -> int:
        return 0

    def process(self, state: int, msg: Msg, ctx: Context) -> Iterable[Msg]:
        return ()


def _kafka(**given: Any) -> KafkaSource:
    return KafkaSource("127.0.0.1:9", topics=["t"], **given)


def test_kafka_and_tiered_sources_satisfy_the_protocol() -> None:
    kafka: Source = _kafka()
    tiered: Source = TieredSource.of(_kafka(archive="/data/raw"))
    assert isinstance(kafka, Source) and isinstance(tiered, Source)
    assert not kafka.reads_archive and tiered.reads_archive
    assert tiered.to_options() == kafka.to_options()  # the same Kafka options
    assert "archive='/data/raw'" in repr(tiered)


def test_a_python_pipeline_reads_its_archive_through_a_tiered_source(tmp_path: Any) -> None:
    pipeline = Pipeline(
        source=_kafka(archive="/data/raw", archive_storage_options={"region": "x"}),
        processor=Counter(),
        sink=ParquetSink(str(tmp_path / "out")),
        checkpoint=str(tmp_path / "cp"),
    )
    assert isinstance(pipeline.source, TieredSource)
    assert pipeline.source.archive_storage_options == {"region": "x"}
    plain = dataclasses.replace(pipeline, source=_kafka())
    assert type(plain.source) is KafkaSource


def test_a_toml_archive_gives_a_tiered_source() -> None:
    config = validate(
        {
            "source": {"topics": ["t"], "bootstrap_servers": "127.0.0.1:9", "archive": "/raw"},
            "processor": {"type": f"{__name__}:Counter"},
            "sink": {"path": "out"},
        }
    )
    source = build_pipeline(config).source
    assert isinstance(source, TieredSource) and source.archive == "/raw"


def test_a_tiered_source_moves_its_start_like_a_kafka_source() -> None:
    # What a repaired checkpoint and an initial state do to a pipeline's source.
    tiered = TieredSource.of(_kafka(archive="/raw"))
    moved = dataclasses.replace(tiered, starting_offsets='{"t": {"0": 7}}')
    assert isinstance(moved, TieredSource) and moved.archive == "/raw"
    assert moved.to_options()["startingOffsets"] == '{"t": {"0": 7}}'


def test_the_tools_read_through_the_options_the_source_gives() -> None:
    options = TieredSource.of(_kafka(archive="/raw")).read_options()
    assert isinstance(options, TieredOptions) and options.archive == "/raw"
    assert range_reader(options) is options and isinstance(options, RangeReader)
    assert isinstance(range_reader(_kafka().read_options()), KafkaReader)


def test_a_kafka_source_naming_an_archive_never_reads_kafka_alone() -> None:
    source = _kafka(archive="/raw")
    with pytest.raises(ConfigError, match="TieredSource"):
        source.read_options()
    with pytest.raises(ConfigError, match="TieredSource"):
        source.load(spark=None)
    with pytest.raises(ConfigError, match="archive: required"):
        TieredSource.of(_kafka())


def test_markers_among_records_and_tombstones_found_at_any_batch_size() -> None:
    """Small batches are tested row by row, large ones in Arrow: both find the same markers,
    and a tombstone (null value, Kafka's timestamp type) is never one."""
    tps = [TopicPartition("a", p) for p in range(3)]
    markers = markers_batch([(tp, 10 * i, 10 * i + 4) for i, tp in enumerate(tps)]).to_pylist()
    record = {**markers[0], "key": b"k", "value": b"v", "timestampType": 0, "headers": None}
    tombstone = {**record, "key": None, "value": None}
    keyed_tombstone = {**record, "value": None}
    rows = [record, markers[0], tombstone, record, markers[1], keyed_tombstone, record] * 2
    rows.append(markers[2])
    schema = markers_batch([]).schema
    whole = pa.RecordBatch.from_pylist(rows, schema=schema)
    found = marker_rows(whole)
    assert found == [(1, 0, 4), (4, 10, 14), (8, 0, 4), (11, 10, 14), (14, 20, 24)]
    for size in (1, 2, 3, 5, 8, 9):
        pieces = [
            (start + i, s, e)
            for start in range(0, len(rows), size)
            for i, s, e in marker_rows(whole.slice(start, size))
        ]
        assert pieces == found, size
    records_only = pa.RecordBatch.from_pylist([record, tombstone, keyed_tombstone], schema=schema)
    assert marker_rows(records_only) == [] and marker_rows(whole.slice(0, 1)) == []


def test_every_reader_and_writer_of_marker_rows_agrees() -> None:
    a, b = TopicPartition("a", 0), TopicPartition("b", 3)
    assert decode_range(encode_range(5, 9)) == (5, 9)
    written = markers_batch([(a, 5, 9), (b, 0, 0)])
    assert marker_rows(written) == [(0, 5, 9), (1, 0, 0)]
    assert _markers(written) == [(0, 5, 9), (1, 0, 0)]
    marker = parse_marker(written.to_pylist()[0])
    assert marker is not None and (marker.tp, marker.start, marker.end) == (a, 5, 9)
    table = partition_table(b, [], start=4)
    assert marker_rows(table) == [(0, 4, 4)]
    text = '[{"key":"' + MARKER_HEADER + '","value":"NC00"}]'
    assert is_marker_json(None, None, -1, text)
    assert not is_marker_json(b"k", None, -1, text)
    record = pa.RecordBatch.from_pylist(
        [{**written.to_pylist()[0], "headers": [{"key": "other", "value": b"1-2"}]}],
        schema=written.schema,
    )
    assert marker_rows(record) == [] and parse_marker(record.to_pylist()[0]) is None
