"""Schema-registry codecs against confluent-kafka's real serializers: over HTTP (a local
registry server), through the in-memory mock registry, and from schema files."""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import time
from pathlib import Path
from typing import Any

import fastavro
import msgspec
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2
from tests.fixtures.registry_server import registry_server

from inorder.codecs import (
    AvroCodec,
    DecodeError,
    FramingError,
    JsonSchemaCodec,
    MalformedPayloadError,
    ProtobufCodec,
    RegistryUnavailableError,
    SchemaRegistry,
    UnknownSchemaIdError,
    UnresolvableSchemaError,
    WrongMagicByteError,
)
from inorder.codecs.protobuf import message_class
from inorder.codecs.registry_client import registry_client
from inorder.errors import ConfigError, InorderError
from inorder.sessions.messages import Insert, SessionCodec, Snapshot

CTX = SerializationContext("readings", MessageField.VALUE)

V1 = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "site", "type": "string"}, {"name": "value", "type": "long"}],
}
V2 = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "site", "type": "string"},
        {"name": "value", "type": "long"},
        {"name": "unit", "type": "string", "default": "C"},
    ],
}
V2_STRICT = {**V2, "fields": [*V2["fields"][:2], {"name": "unit", "type": "string"}]}


@dataclasses.dataclass
class Reading:
    site: str
    value: int


class ReadingV2(msgspec.Struct):
    site: str
    value: int
    unit: str


def _client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url})


def _avro(url: str, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    value: bytes = AvroSerializer(_client(url), json.dumps(schema))(record, CTX)
    return value


# -- HTTP path --------------------------------------------------------------------------


def test_avro_round_trip_over_http_fetches_each_schema_once() -> None:
    with registry_server() as server:
        values = [_avro(server.url, V1, {"site": f"s{i}", "value": i}) for i in range(5)]
        codec = pickle.loads(pickle.dumps(AvroCodec(Reading, registry=server.url)))
        got = [codec.decode(v, None) for v in values]
        assert got == [Reading(f"s{i}", i) for i in range(5)]
        # A second codec in the same process shares the client and its schema cache.
        again = pickle.loads(pickle.dumps(AvroCodec(Reading, registry=server.url)))
        assert again.decode(values[0], None) == Reading("s0", 0)
        assert server.requests["/schemas/ids/1"] == 1


def test_schema_evolution_v1_and_v2_records_read_as_v2() -> None:
    with registry_server() as server:
        values = [
            _avro(server.url, V1, {"site": "a", "value": 1}),
            _avro(server.url, V2, {"site": "b", "value": 2, "unit": "F"}),
            _avro(server.url, V1, {"site": "c", "value": 3}),
        ]
        codec = AvroCodec(ReadingV2, registry=server.url, reader_schema=json.dumps(V2))
        assert [codec.decode(v, None) for v in values] == [
            ReadingV2("a", 1, "C"),
            ReadingV2("b", 2, "F"),
            ReadingV2("c", 3, "C"),
        ]
        strict = AvroCodec(ReadingV2, registry=server.url, reader_schema=json.dumps(V2_STRICT))
        with pytest.raises(UnresolvableSchemaError, match="writer schema id 1 cannot be read"):
            strict.decode(values[0], None)
        assert strict.decode(values[1], None) == ReadingV2("b", 2, "F")


def test_use_latest_version_reads_with_the_subjects_latest_schema() -> None:
    with registry_server() as server:
        old = _avro(server.url, V1, {"site": "a", "value": 1})
        _avro(server.url, V2, {"site": "b", "value": 2, "unit": "F"})
        codec = AvroCodec(
            ReadingV2,
            registry=server.url,
            subject_name_strategy="topic",
            subject_topic="readings",
            use_latest_version=True,
        )
        assert codec.decode(old, None) == ReadingV2("a", 1, "C")
        assert server.requests["/subjects/readings-value/versions/latest"] >= 1


def test_bad_records_are_distinct_named_errors() -> None:
    with registry_server() as server:
        good = _avro(server.url, V1, {"site": "a", "value": 1})
        codec = AvroCodec(Reading, registry=server.url)
        cases: list[tuple[bytes, type[DecodeError], str]] = [
            (b"\x00\x00\x00\x00\x63" + good[5:], UnknownSchemaIdError, "unknown schema id 99"),
            (b'{"site": "a"}', WrongMagicByteError, "wrong magic byte 0x7b"),
            (b"\x00\x00", FramingError, "2 bytes is too short"),
            (good[:6], MalformedPayloadError, "invalid Avro payload for schema id 1"),
        ]
        texts = set()
        for value, error, text in cases:
            with pytest.raises(error, match=text) as caught:
                codec.decode(value, None)
            assert isinstance(caught.value, InorderError)
            texts.add(str(caught.value))
        assert len(texts) == len(cases)
        with pytest.raises(DecodeError, match="avro record does not fit Reading"):
            AvroCodec(ReadingV2, registry=server.url).decode(good, None)


def test_registry_outage_is_not_a_decode_error() -> None:
    with registry_server() as server:
        value = _avro(server.url, V1, {"site": "a", "value": 1})
        registry = SchemaRegistry(server.url, max_retries=2, retries_wait_ms=5)
        codec = AvroCodec(Reading, registry=registry)
        server.outage = 503
        with pytest.raises(RegistryUnavailableError, match="HTTP 503") as caught:
            codec.decode(value, None)
        assert not isinstance(caught.value, DecodeError)
        assert server.requests["/schemas/ids/1"] == 3  # the first try and two retries
        server.outage = None
        assert codec.decode(value, None) == Reading("a", 1)  # nothing was cached as bad
        fresh = _avro(server.url, V2, {"site": "b", "value": 2, "unit": "F"})
        server.stop()
        started = time.monotonic()
        with pytest.raises(RegistryUnavailableError, match=r"unreachable .ConnectError."):
            codec.decode(fresh, None)
        assert time.monotonic() - started < 10


def test_credentials_are_sent_but_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    with registry_server(user_info="alice:s3cret") as server:
        value = _avro(server.url.replace("//", "//alice:s3cret@"), V1, {"site": "a", "value": 1})
        monkeypatch.setenv("REG_AUTH", "alice:s3cret")
        codec = AvroCodec(Reading, registry=SchemaRegistry(server.url, user_info_env="REG_AUTH"))
        assert codec.decode(value, None) == Reading("a", 1)
        assert "s3cret" not in repr(codec) and "s3cret" not in repr(
            pickle.loads(pickle.dumps(codec))
        )
        monkeypatch.setenv("REG_AUTH", "alice:wrong")
        wrong = AvroCodec(Reading, registry=SchemaRegistry(server.url, user_info_env="REG_AUTH"))
        with pytest.raises(RegistryUnavailableError, match="refused the credentials") as caught:
            wrong.decode(value, None)
        assert "wrong" not in str(caught.value)
    with pytest.raises(ConfigError, match="NOT_SET_ANYWHERE"):
        SchemaRegistry("http://127.0.0.1:1", user_info_env="NOT_SET_ANYWHERE")
    shown = repr(SchemaRegistry("http://bob:Pw9x@127.0.0.1:1", bearer_token="Tk7q"))
    assert "Pw9x" not in shown and "Tk7q" not in shown and "bearer_token='***'" in shown


# -- mock registry, Protobuf, JSON Schema, sessions ---------------------------------------


def _reading_proto() -> tuple[bytes, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="reading.proto", package="demo", syntax="proto3")
    msg = fd.message_type.add(name="Reading")
    msg.field.add(name="site", number=1, type=9, label=1)  # string
    msg.field.add(name="value", number=2, type=3, label=1)  # int64
    tags = msg.field.add(name="tags", number=3, type=9, label=3)  # repeated string
    assert tags.name == "tags"
    fds = descriptor_pb2.FileDescriptorSet(file=[fd]).SerializeToString()
    return fds, message_class(fds, "demo.Reading")


class ProtoReading(msgspec.Struct):
    site: str
    value: int
    tags: list[str]


def test_protobuf_framed_and_from_descriptor_set(tmp_path: Path) -> None:
    fds, cls = _reading_proto()
    registry = SchemaRegistry("mock://proto")
    serializer = ProtobufSerializer(
        cls, registry_client(registry), {"use.deprecated.format": False}
    )
    framed = serializer(cls(site="a", value=2**40, tags=["x"]), CTX)
    codec = pickle.loads(pickle.dumps(ProtobufCodec(ProtoReading, message=cls, registry=registry)))
    assert codec.decode(framed, None) == ProtoReading("a", 2**40, ["x"])
    (tmp_path / "r.desc").write_bytes(fds)
    plain = ProtobufCodec(
        ProtoReading, descriptor_set=tmp_path / "r.desc", message_name="demo.Reading"
    )
    assert plain.decode(cls(site="b", value=1).SerializeToString(), None) == ProtoReading(
        "b", 1, []
    )
    with pytest.raises(MalformedPayloadError, match="for the schema file"):
        plain.decode(b"\xff\xff\xff", None)
    with pytest.raises(ConfigError, match=r"demo.Nope.*demo.Reading"):
        ProtobufCodec(descriptor_set=fds, message_name="demo.Nope")


def test_json_schema_validates_against_the_writer_schema() -> None:
    registry = SchemaRegistry("mock://jsonschema")
    schema = {
        "type": "object",
        "properties": {"site": {"type": "string"}, "value": {"type": "integer"}},
        "required": ["site", "value"],
    }
    value = JSONSerializer(json.dumps(schema), registry_client(registry))(
        {"site": "a", "value": 1}, CTX
    )
    codec = JsonSchemaCodec(Reading, registry=registry)
    assert codec.decode(value, None) == Reading("a", 1)
    bad = value[:5] + b'{"site": "a", "value": "x"}'
    with pytest.raises(MalformedPayloadError, match="'x' is not of type 'integer'"):
        codec.decode(bad, None)
    assert JsonSchemaCodec(registry=registry, validate=False).decode(bad, None)["value"] == "x"


SESSION = {
    "type": "record",
    "name": "SessionMessage",
    "fields": [
        {"name": "type", "type": "string"},
        {"name": "session", "type": "string"},
        {"name": "seq", "type": "long"},
        {"name": "ts", "type": ["null", "double"], "default": None},
        {
            "name": "rows",
            "type": ["null", {"type": "array", "items": {"type": "map", "values": "string"}}],
            "default": None,
        },
        {"name": "row", "type": ["null", {"type": "map", "values": "string"}], "default": None},
        {"name": "id", "type": ["null", "string"], "default": None},
    ],
}


def _session(**fields: Any) -> dict[str, Any]:
    return {"ts": None, "rows": None, "row": None, "id": None, **fields}


def test_session_messages_in_avro_pass_the_session_codecs_checks() -> None:
    registry = SchemaRegistry("mock://sessions")
    serializer = AvroSerializer(registry_client(registry), json.dumps(SESSION))
    codec = AvroCodec(registry=registry, via=SessionCodec())
    snap = serializer(
        _session(type="snapshot", session="S", seq=0, rows=[{"id": "r1", "v": "a"}]), CTX
    )
    assert codec.decode(snap, b"S") == Snapshot("S", 0, [{"id": "r1", "v": "a"}])
    ins = serializer(_session(type="insert", session="S", seq=1, row={"id": "r2"}), CTX)
    assert codec.decode(ins, b"S") == Insert("S", 1, {"id": "r2"})
    no_key = serializer(_session(type="insert", session="S", seq=2, row={"v": "x"}), CTX)
    with pytest.raises(DecodeError, match="row has no string or integer 'id' field"):
        codec.decode(no_key, b"S")


# -- schema from file, settings ----------------------------------------------------------------


def test_avro_schema_file_reads_plain_avro_binary(tmp_path: Path) -> None:
    (tmp_path / "v1.avsc").write_text(json.dumps(V1))
    (tmp_path / "v2.avsc").write_text(json.dumps(V2))
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(V1), {"site": "a", "value": 7})
    codec = AvroCodec(
        ReadingV2, schema_file=tmp_path / "v1.avsc", reader_schema=tmp_path / "v2.avsc"
    )
    assert codec.decode(buffer.getvalue(), None) == ReadingV2("a", 7, "C")
    with pytest.raises(MalformedPayloadError, match="schema file: 1 bytes after the Avro datum"):
        codec.decode(buffer.getvalue() + b"\x00", None)
    with pytest.raises(ConfigError, match="either a registry or a schema_file"):
        AvroCodec(Reading)
    with pytest.raises(ConfigError, match=r"codec.reader_schema: not a valid Avro schema"):
        AvroCodec(Reading, registry="mock://x", reader_schema='{"type": "nope"}')
    with pytest.raises(ConfigError, match=r"needs codec.subject_topic"):
        AvroCodec(Reading, registry="mock://x", subject_name_strategy="topic")


def test_pipeline_file_codec_section(tmp_path: Path) -> None:
    from inorder.assemble import make_codec
    from inorder.pipeline.config import validate
    from inorder.sessions.processor import SessionTables

    (tmp_path / "v2.avsc").write_text(json.dumps(V2))
    config = validate(
        {
            "processor": {"type": "sessions"},
            "sink": {"path": str(tmp_path / "out")},
            "source": {"topics": ["sessions"]},
            "codec": {
                "type": "avro",
                "registry_url": "mock://toml",
                "reader_schema": str(tmp_path / "v2.avsc"),
            },
        }
    )
    codec = make_codec(config, SessionTables())
    assert isinstance(codec, AvroCodec) and isinstance(codec.via, SessionCodec)
    config["codec"] = {**config["codec"], "type": "json"}
    with pytest.raises(ConfigError, match=r"codec.registry_url applies to codec.type avro"):
        make_codec(config, SessionTables())
    config["codec"] = {**config["codec"], "type": "protobuf", "registry_url": ""}
    with pytest.raises(ConfigError, match=r"codec.reader_schema applies to codec.type = 'avro'"):
        make_codec(config, SessionTables())
