"""The registry codecs' two paths (confluent-kafka's deserializer for every record, and the
per-framing cache in front of it) give the same message or the same error for every record;
Protobuf messages become plain data by the documented rules."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import msgspec
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, timestamp_pb2
from tests.fixtures.registry_server import registry_server

from inorder.codecs import AvroCodec, ProtobufCodec, SchemaRegistry
from inorder.codecs.protobuf import message_class, to_plain
from inorder.codecs.registry_base import RegistryCodec
from inorder.codecs.registry_client import registry_client
from inorder.codecs.registry_fast import SchemaCache, pick_path

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


class ReadingV2(msgspec.Struct):
    site: str
    value: int
    unit: str


@dataclasses.dataclass
class Counted:
    """confluent's deserializer, counting the records it is asked for."""

    slow: Callable[[bytes], Any]
    calls: int = 0

    def __call__(self, value: bytes) -> Any:
        self.calls += 1
        return self.slow(value)


def _both_paths(codec: RegistryCodec[Any]) -> tuple[Callable[[bytes], Any], Counted, Any]:
    """Independent deserializers for the codec: always confluent's, and the one it picks."""
    slow, _ = codec._paths()
    counted = Counted(codec._paths()[0])
    _, prepare = codec._paths()
    fast = pick_path(
        counted,
        prepare,
        codec.schema_type,
        subject_name_strategy=codec.subject_name_strategy,
        min_length=codec._min_length,
    )
    return slow, counted, fast


def _outcome(codec: RegistryCodec[Any], deserialize: Callable[[bytes], Any], value: bytes) -> Any:
    try:
        return ("message", codec._decode_with(deserialize, value, None))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


def _same(codec: RegistryCodec[Any], values: list[bytes]) -> list[Any]:
    slow, counted, fast = _both_paths(codec)
    assert isinstance(fast, SchemaCache)
    outcomes = []
    for value in values:
        expected = _outcome(codec, slow, value)
        assert _outcome(codec, fast, value) == expected, value
        outcomes.append(expected)
    return [counted.calls, *outcomes]


def _avro(url: str, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    value: bytes = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))(
        record, CTX
    )
    return value


def test_avro_paths_agree_on_records_and_every_error() -> None:
    with registry_server() as server:
        v1 = [_avro(server.url, V1, {"site": f"a{i}", "value": i}) for i in range(20)]
        v2 = [_avro(server.url, V2, {"site": f"b{i}", "value": i, "unit": "F"}) for i in range(20)]
        registry = SchemaRegistry(server.url, max_retries=1, retries_wait_ms=5)
        codec = AvroCodec(ReadingV2, registry=registry, reader_schema=json.dumps(V2))
        bad = [
            b'{"site": "a"}',  # wrong magic byte
            b"\x00\x00",  # too short for the framing
            v1[0][:5],  # the framing of a known schema and nothing after it
            b"\x00\x00\x00\x00\x63" + v1[0][5:],  # unknown schema id 99
            v1[0][:7],  # a known schema, a truncated payload
            v2[0][:-1],
            b"\x01" + v1[0][1:],  # a GUID that is too short
        ]
        calls, *outcomes = _same(codec, [*v1, *v2, *bad, *v1[:3]])
        assert outcomes[0] == ("message", ReadingV2("a0", 0, "C"))
        assert outcomes[20] == ("message", ReadingV2("b0", 0, "F"))
        assert [o[1] for o in outcomes[40:47]] == [
            "WrongMagicByteError",
            "FramingError",
            "FramingError",
            "UnknownSchemaIdError",
            "MalformedPayloadError",
            "MalformedPayloadError",
            "MalformedPayloadError",
        ]
        # One deserializer call per writer schema, then one per bad record.
        assert calls == 2 + len(bad)

        # A reader schema the writer cannot be resolved to, and records that do not fit.
        strict = AvroCodec(ReadingV2, registry=registry, reader_schema=json.dumps(V2_STRICT))
        calls, *outcomes = _same(strict, [v1[0], v2[0], v1[1], v2[1]])
        assert [o[:2] for o in outcomes] == [
            ("error", "UnresolvableSchemaError"),
            ("message", ReadingV2("b0", 0, "F")),
            ("error", "UnresolvableSchemaError"),
            ("message", ReadingV2("b1", 1, "F")),
        ]
        calls, *outcomes = _same(AvroCodec(ReadingV2, registry=registry), [v1[0], v1[1]])
        assert outcomes[0][:2] == ("error", "DecodeError") and outcomes[0] == outcomes[1]

        # An outage: a schema not yet fetched fails the same way on both paths; after it,
        # the schema is fetched and cached as if nothing had happened.
        v3 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": "string", "default": ""}]}
        fresh = _avro(server.url, v3, {"site": "c", "value": 3, "note": "n"})
        server.outage = 503
        calls, *outcomes = _same(codec, [fresh, v1[0]])
        assert outcomes[0][:2] == ("error", "RegistryUnavailableError")
        assert outcomes[1] == ("message", ReadingV2("a0", 0, "C"))  # cached before the outage
        server.outage = None
        calls, *outcomes = _same(codec, [fresh, fresh])
        assert outcomes == [("message", ReadingV2("c", 3, "C"))] * 2 and calls == 1


def test_a_subject_name_strategy_keeps_confluents_deserializer() -> None:
    codec = AvroCodec(
        ReadingV2,
        registry="mock://strategy",
        subject_name_strategy="topic",
        subject_topic="readings",
        use_latest_version=True,
    )
    *_, fast = _both_paths(codec)
    assert isinstance(fast, Counted)
    plain = AvroCodec(ReadingV2, schema_file=json.dumps(V1))
    assert plain._paths()[1] is None


class ProtoReading(msgspec.Struct):
    site: str
    value: int
    tags: list[str]


def _reading_proto() -> tuple[bytes, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="fast.proto", package="fast", syntax="proto3")
    msg = fd.message_type.add(name="Reading")
    msg.field.add(name="site", number=1, type=9, label=1)
    msg.field.add(name="value", number=2, type=3, label=1)
    msg.field.add(name="tags", number=3, type=9, label=3)
    fd.message_type.add(name="Other").field.add(name="x", number=1, type=3, label=1)
    fds = descriptor_pb2.FileDescriptorSet(file=[fd]).SerializeToString()
    return fds, message_class(fds, "fast.Reading")


def test_protobuf_paths_agree_on_records_and_every_error() -> None:
    _, cls = _reading_proto()
    registry = SchemaRegistry("mock://fast-proto")
    serializer = ProtobufSerializer(
        cls, registry_client(registry), {"use.deprecated.format": False}
    )
    good = [serializer(cls(site=f"s{i}", value=2**40 + i, tags=["x"] * i), CTX) for i in range(20)]
    framing = good[0][: len(good[0]) - len(cls(site="s0", value=2**40).SerializeToString())]
    bad = [
        b"\x07" + good[0][1:],  # wrong magic byte
        b"\x00\x00",  # too short
        b"\x00\x00\x00\x00\x63" + good[0][5:],  # unknown schema id 99
        framing[:5] + b"\x02\x0a" + good[0][len(framing) :],  # message index 5: not in the schema
        framing + b"\xff\xff\xff",  # the known framing, a malformed payload
    ]
    codec: ProtobufCodec[Any] = ProtobufCodec(ProtoReading, message=cls, registry=registry)
    calls, *outcomes = _same(codec, [*good, *bad, good[3]])
    assert outcomes[5] == ("message", ProtoReading("s5", 2**40 + 5, ["x"] * 5))
    assert [o[1] for o in outcomes[20:25]] == [
        "WrongMagicByteError",
        "MalformedPayloadError",  # confluent's framing reader runs out of bytes
        "UnknownSchemaIdError",
        "MalformedPayloadError",
        "MalformedPayloadError",
    ]
    assert "message index 5 out of range" in outcomes[23][2]
    assert calls == 1 + len(bad)
    plain: ProtobufCodec[Any] = ProtobufCodec(ProtoReading, message=cls)
    assert plain._paths()[1] is None


def _rich_proto() -> Any:
    fd = descriptor_pb2.FileDescriptorProto(
        name="rich.proto",
        package="rich",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    color = fd.enum_type.add(name="Color")
    color.value.add(name="RED", number=0)
    color.value.add(name="BLUE", number=1)
    inner = fd.message_type.add(name="Inner")
    inner.field.add(name="n", number=1, type=3, label=1)
    msg = fd.message_type.add(name="Rich")
    for name, value_type, value_name in (
        ("counts", 3, ""),
        ("inners", 11, ".rich.Inner"),
        ("colors", 14, ".rich.Color"),
    ):
        entry = msg.nested_type.add(name=name.capitalize() + "Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=9, label=1)
        entry.field.add(name="value", number=2, type=value_type, label=1)
        if value_name:
            entry.field[1].type_name = value_name
    fields: list[dict[str, Any]] = [
        {"name": "plain", "type": 3},
        {"name": "maybe", "type": 3, "proto3_optional": True, "oneof_index": 0},
        {"name": "color", "type": 14, "type_name": ".rich.Color"},
        {"name": "palette", "type": 14, "type_name": ".rich.Color", "label": 3},
        {"name": "inner", "type": 11, "type_name": ".rich.Inner"},
        {"name": "inner_list", "type": 11, "type_name": ".rich.Inner", "label": 3},
        {"name": "at", "type": 11, "type_name": ".google.protobuf.Timestamp"},
        {"name": "counts", "type": 11, "type_name": ".rich.Rich.CountsEntry", "label": 3},
        {"name": "inners", "type": 11, "type_name": ".rich.Rich.InnersEntry", "label": 3},
        {"name": "colors", "type": 11, "type_name": ".rich.Rich.ColorsEntry", "label": 3},
        {"name": "words", "type": 9, "label": 3},
    ]
    for number, field in enumerate(fields, start=1):
        msg.field.add(number=number, label=field.pop("label", 1), **field)
    msg.oneof_decl.add(name="_maybe")
    stamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(stamp)
    fds = descriptor_pb2.FileDescriptorSet(file=[stamp, fd]).SerializeToString()
    return message_class(fds, "rich.Rich")


def test_protobuf_messages_become_plain_data_by_field() -> None:
    cls = _rich_proto()
    empty = to_plain(cls())
    assert empty == {
        "plain": 0,
        "maybe": None,
        "color": "RED",
        "palette": [],
        "inner": None,
        "inner_list": [],
        "at": None,
        "counts": {},
        "inners": {},
        "colors": {},
        "words": [],
    }
    assert list(empty) == [field.name for field in cls.DESCRIPTOR.fields]
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    full = cls(
        plain=2**40,
        maybe=0,
        color=1,
        palette=[1, 0, 7],
        inner={"n": 3},
        inner_list=[{"n": 1}, {"n": 2}],
        counts={"a": 1},
        inners={"k": {"n": 4}},
        colors={"c": 1, "d": 9},
        words=["x", "y"],
    )
    full.at.FromDatetime(at)
    assert to_plain(cls.FromString(full.SerializeToString())) == {
        "plain": 2**40,
        "maybe": 0,
        "color": "BLUE",
        "palette": ["BLUE", "RED", 7],
        "inner": {"n": 3},
        "inner_list": [{"n": 1}, {"n": 2}],
        "at": at,
        "counts": {"a": 1},
        "inners": {"k": {"n": 4}},
        "colors": {"c": "BLUE", "d": 9},
        "words": ["x", "y"],
    }
