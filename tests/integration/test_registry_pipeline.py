"""Avro through a real pipeline: confluent-kafka's serializer produces to the broker, a local
HTTP schema registry serves the schemas, Spark runs the ordered engine, Parquet is committed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.e2e.cli_jobs import CountReadings, Reading
from tests.fixtures.registry_server import registry_server

from inorder import Integrity, KafkaSource, ParquetSink, Pipeline
from inorder.codecs import AvroCodec, SchemaRegistry
from inorder.errors import InorderError
from inorder.sinks.parquet import read_committed

V1 = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "site", "type": "string"}, {"name": "value", "type": "long"}],
}
V2 = {**V1, "fields": [*V1["fields"], {"name": "unit", "type": "string", "default": "C"}]}


def _produce(bootstrap: str, topic: str, url: str) -> None:
    """Offsets 0-5: V1 and V2 records alternate; offset 3 is plain JSON (no framing)."""
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(V1))
    v2 = AvroSerializer(client, json.dumps(V2))
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(6):
        if i == 3:
            value = b'{"site": "s1", "value": 3}'
        elif i % 2:
            value = v2({"site": f"s{i % 2}", "value": i, "unit": "F"}, ctx)
        else:
            value = v1({"site": f"s{i % 2}", "value": i}, ctx)
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0


def _pipeline(
    kafka: Any, topic: str, tmp_path: Path, registry: SchemaRegistry
) -> Pipeline[Any, Any, Any]:
    return Pipeline(
        source=KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topics=[topic]),
        processor=CountReadings(),
        codec=AvroCodec(Reading, registry=registry, reader_schema=json.dumps(V1)),
        integrity=Integrity.strict(on_violation="dead_letter"),
        sink=ParquetSink(str(tmp_path / "out")),
        checkpoint=str(tmp_path / "ck"),
        trigger="available-now",
        spark_master="local[2]",
        progress="quiet",
    )


def test_avro_pipeline_with_evolution_and_a_dead_letter(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"avro-{random.randrange(10**9)}")
    with registry_server() as server:
        _produce(kafka.bootstrap_servers, topic, server.url)
        _pipeline(kafka, topic, tmp_path, SchemaRegistry(server.url)).run()
        rows = read_committed(str(tmp_path / "out")).to_pylist()
    got = sorted((r["offset"], r["key"], r["n"]) for r in rows)
    assert got == [(0, "s0", 1), (1, "s1", 1), (2, "s0", 2), (4, "s0", 3), (5, "s1", 2)]
    letters = read_committed(str(tmp_path / "out") + "_dead_letter").to_pylist()
    assert [(r["offset"], r["rule"]) for r in letters] == [(3, "undecodable")]
    assert "wrong magic byte 0x7b" in letters[0]["detail"]
    assert letters[0]["topic"] == topic and letters[0]["partition"] == 0


def test_registry_outage_fails_the_batch_and_dead_letters_nothing(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"avro-down-{random.randrange(10**9)}")
    with registry_server() as server:
        _produce(kafka.bootstrap_servers, topic, server.url)
        registry = SchemaRegistry(server.url, max_retries=1, retries_wait_ms=10)
        server.outage = 503
        with pytest.raises(InorderError, match=r"schema registry http://127\.0\.0\.1:\d+ failed"):
            _pipeline(kafka, topic, tmp_path, registry).run()
        out = tmp_path / "out"
        assert not list(out.rglob("*.parquet")) if out.exists() else True
        dead = Path(f"{out}_dead_letter")
        assert not list(dead.rglob("*.parquet")) if dead.exists() else True
        # The registry is back: the same checkpoint re-runs the batch and loses nothing.
        server.outage = None
        _pipeline(kafka, topic, tmp_path, registry).run()
    assert sorted(r["offset"] for r in read_committed(str(out)).to_pylist()) == [0, 1, 2, 4, 5]
    letters = read_committed(f"{out}_dead_letter").to_pylist()
    assert [r["offset"] for r in letters] == [3]
