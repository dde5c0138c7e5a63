"""Decode cost of Avro and Protobuf against JSON on the same logical records.

One core, no Spark, no broker: each codec decodes the same N records (a msgspec.Struct with a
string, an integer, a float, a boolean and a list of strings) into the same message type.
Formats alternate round by round so drift (other load, CPU frequency) hits all of them;
the table shows medians over the rounds of records/s (wall) and CPU microseconds per record
(process CPU time), and each format's CPU per record relative to JSON.

Framed formats use confluent-kafka's serializers and deserializers with its in-memory
registry (``mock://``): writer schemas are fetched once, as on a worker. Two reference rows
show what bounds the codecs: the payload decoders alone (fastavro's ``schemaless_reader`` on
plain Avro, the Protobuf class's ``FromString``), producing plain data, not a ``Reading``.

    .venv/bin/python bench/decode_formats.py [--records 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import fastavro
import msgspec
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2

from inorder.codecs import AvroCodec, JsonCodec, ProtobufCodec, SchemaRegistry
from inorder.codecs.protobuf import message_class
from inorder.codecs.registry_client import registry_client


class Reading(msgspec.Struct):
    """The logical record every format carries."""

    site: str
    seq: int
    value: float
    ok: bool
    tags: list[str]


AVRO = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "site", "type": "string"},
        {"name": "seq", "type": "long"},
        {"name": "value", "type": "double"},
        {"name": "ok", "type": "boolean"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def _proto() -> tuple[bytes, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="bench.proto", package="bench", syntax="proto3")
    msg = fd.message_type.add(name="Reading")
    for number, (name, kind, label) in enumerate(
        [("site", 9, 1), ("seq", 3, 1), ("value", 1, 1), ("ok", 8, 1), ("tags", 9, 3)], start=1
    ):
        msg.field.add(name=name, number=number, type=kind, label=label)
    fds = descriptor_pb2.FileDescriptorSet(file=[fd]).SerializeToString()
    return fds, message_class(fds, "bench.Reading")


def _records(n: int) -> list[dict[str, Any]]:
    return [
        {
            "site": f"site-{i % 97}",
            "seq": i,
            "value": i * 0.25,
            "ok": i % 3 == 0,
            "tags": ["a", f"t{i % 5}"],
        }
        for i in range(n)
    ]


Decode = Callable[[bytes, bytes | None], Any]


def _cases(n: int) -> dict[str, tuple[Decode, list[bytes]]]:
    records = _records(n)
    ctx = SerializationContext("bench", MessageField.VALUE)
    registry = SchemaRegistry("mock://bench")
    client = registry_client(registry)
    avro_ser = AvroSerializer(client, json.dumps(AVRO))
    fds, proto_cls = _proto()
    proto_ser = ProtobufSerializer(proto_cls, client, {"use.deprecated.format": False})
    plain_schema = fastavro.parse_schema(AVRO)

    def plain_avro(record: dict[str, Any]) -> bytes:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, plain_schema, record)
        return buffer.getvalue()

    def bare_avro(value: bytes, key: bytes | None) -> Any:
        return fastavro.schemaless_reader(io.BytesIO(value), plain_schema, None)

    def bare_protobuf(value: bytes, key: bytes | None) -> Any:
        return proto_cls.FromString(value)

    schema_file = json.dumps(AVRO)
    plain_avro_values = [plain_avro(r) for r in records]
    plain_proto_values = [proto_cls(**r).SerializeToString() for r in records]
    return {
        "json": (JsonCodec(Reading).decode, [msgspec.json.encode(r) for r in records]),
        "avro (registry)": (
            AvroCodec(Reading, registry=registry).decode,
            [avro_ser(r, ctx) for r in records],
        ),
        "avro (schema file)": (
            AvroCodec(Reading, schema_file=schema_file).decode,
            plain_avro_values,
        ),
        "protobuf (registry)": (
            ProtobufCodec(Reading, message=proto_cls, registry=registry).decode,
            [proto_ser(proto_cls(**r), ctx) for r in records],
        ),
        "protobuf (descriptor set)": (
            ProtobufCodec(Reading, descriptor_set=fds, message_name="bench.Reading").decode,
            plain_proto_values,
        ),
        "(fastavro schemaless_reader alone)": (bare_avro, plain_avro_values),
        "(protobuf FromString alone)": (bare_protobuf, plain_proto_values),
    }


def main() -> None:
    """Run the rounds and print one markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cases = _cases(args.records)
    expected = msgspec.convert(_records(1)[0], Reading)
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for name, (decode, values) in cases.items():
        if not name.startswith("("):
            assert decode(values[0], None) == expected  # same logical data, warm caches
    for _ in range(args.rounds):
        for name, (decode, values) in cases.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for value in values:
                decode(value, None)
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    n = args.records
    json_cpu = statistics.median(cpu["json"]) / n
    print(f"{n} records x {args.rounds} rounds (medians), one core\n")
    print("| format | records/s | CPU µs/record | CPU vs JSON |")
    print("|---|---:|---:|---:|")
    for name in cases:
        per = statistics.median(cpu[name]) / n
        rate = n / statistics.median(wall[name])
        print(f"| {name} | {rate:,.0f} | {per * 1e6:.2f} | {per / json_cpu:.1f}x |")


if __name__ == "__main__":
    main()
