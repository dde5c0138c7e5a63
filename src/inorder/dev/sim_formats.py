"""Simulated session messages in the Schema Registry formats (Avro, Protobuf, JSON Schema).

The simulator's model produces each message as JSON (the session contract); with
``--format avro|protobuf|json-schema`` :func:`framed_encoder` turns every value into a
registry-framed record with confluent-kafka's own serializer, which registers the writer
schema under the topic's value subject (``<topic>-value``, the default subject name strategy)
on first use. A value that is not JSON (a ``malformed`` fault: truncated bytes) is sent as it
is, so it stays undecodable for a consumer of the framed format (wrong magic byte).

The schemas describe the messages the simulator sends: ``type``, ``session``, ``seq``,
``ts``, and per operation ``rows`` (snapshot), ``row`` (insert, update) or ``id`` (delete);
rows carry the columns ``id``, ``name``, ``value`` and ``count``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from inorder.errors import ConfigError

#: ``--format`` values: the plain JSON contract and the three registry formats.
FORMATS = ("json", "avro", "protobuf", "json-schema")

#: Any JSON scalar a row column holds, as an Avro union (numbers keep their kind).
_AVRO_VALUE = ["null", "boolean", "long", "double", "string"]

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "SessionMessage",
    "namespace": "inorder.sim",
    "fields": [
        {"name": "type", "type": "string"},
        {"name": "session", "type": "string"},
        {"name": "seq", "type": "long"},
        {"name": "ts", "type": ["null", "double"], "default": None},
        {
            "name": "rows",
            "type": ["null", {"type": "array", "items": {"type": "map", "values": _AVRO_VALUE}}],
            "default": None,
        },
        {"name": "row", "type": ["null", {"type": "map", "values": _AVRO_VALUE}], "default": None},
        {"name": "id", "type": ["null", "string"], "default": None},
    ],
}

_ROW_SCHEMA: dict[str, Any] = {"type": "object"}
JSON_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "SessionMessage",
    "type": "object",
    "properties": {
        "type": {"type": "string"},
        "session": {"type": "string"},
        "seq": {"type": "integer"},
        "ts": {"type": ["number", "null"]},
        "rows": {"type": "array", "items": _ROW_SCHEMA},
        "row": _ROW_SCHEMA,
        "id": {"type": ["string", "integer"]},
    },
    "required": ["type", "session", "seq"],
}


def session_proto_file() -> Any:
    """The ``FileDescriptorProto`` of ``inorder.sim.SessionMessage`` (proto3)."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(
        name="inorder_sim_session.proto", package="inorder.sim", syntax="proto3"
    )
    row = fd.message_type.add(name="Row")
    for number, (name, kind) in enumerate(
        [("id", fdp.TYPE_STRING), ("name", fdp.TYPE_STRING), ("value", fdp.TYPE_DOUBLE),
         ("count", fdp.TYPE_INT64)],
        start=1,
    ):  # fmt: skip
        row.field.add(name=name, number=number, type=kind, label=fdp.LABEL_OPTIONAL)
    msg = fd.message_type.add(name="SessionMessage")
    fields: list[tuple[str, int, str, bool]] = [
        ("type", fdp.TYPE_STRING, "", False),
        ("session", fdp.TYPE_STRING, "", False),
        ("seq", fdp.TYPE_INT64, "", False),
        ("ts", fdp.TYPE_DOUBLE, "", True),
        ("rows", fdp.TYPE_MESSAGE, ".inorder.sim.Row", False),
        ("row", fdp.TYPE_MESSAGE, ".inorder.sim.Row", False),
        ("id", fdp.TYPE_STRING, "", True),
    ]
    for number, (name, kind, type_name, optional) in enumerate(fields, start=1):
        field = msg.field.add(name=name, number=number, type=kind, label=fdp.LABEL_OPTIONAL)
        if name == "rows":
            field.label = fdp.LABEL_REPEATED
        if type_name:
            field.type_name = type_name
        if optional:
            # proto3 `optional`: presence is kept, so an absent ts or id decodes as None.
            field.proto3_optional = True
            field.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{name}")
    return fd


@functools.cache
def session_message_class() -> Any:
    """The generated class of ``inorder.sim.SessionMessage`` (also importable as
    ``inorder.dev.sim_formats:SessionMessage``, the ``codec.message_type`` of a pipeline)."""
    from google.protobuf import descriptor_pb2

    from inorder.codecs.protobuf import message_class

    files = descriptor_pb2.FileDescriptorSet(file=[session_proto_file()])
    return message_class(files.SerializeToString(), "inorder.sim.SessionMessage")


def __getattr__(name: str) -> Any:
    # The class is built on first use, so importing this module needs no protobuf runtime.
    if name == "SessionMessage":
        return session_message_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def framed_encoder(fmt: str, registry_url: str) -> Callable[[str, bytes], bytes] | None:
    """``encode(topic, json_value)`` for ``fmt``; ``None`` for plain JSON (no re-encoding)."""
    if fmt == "json":
        return None
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.serialization import MessageField, SerializationContext
    except ImportError as exc:
        raise ConfigError(
            f"--format {fmt}: {exc.name} is missing: pip install 'inorder[registry]'"
        ) from None
    client = SchemaRegistryClient({"url": registry_url})
    to_message: Callable[[Any], Any] = lambda doc: doc  # noqa: E731
    serializer: Any
    if fmt == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        serializer = AvroSerializer(client, json.dumps(AVRO_SCHEMA))
    elif fmt == "json-schema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        serializer = JSONSerializer(json.dumps(JSON_SCHEMA), client)
    else:
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from google.protobuf import json_format

        cls = session_message_class()
        serializer = ProtobufSerializer(cls, client, {"use.deprecated.format": False})

        def to_message(doc: Any) -> Any:
            return json_format.ParseDict(doc, cls())

    contexts: dict[str, Any] = {}

    def encode(topic: str, value: bytes) -> bytes:
        try:
            doc = json.loads(value)
        except ValueError:
            return value  # a malformed fault stays malformed
        ctx = contexts.get(topic)
        if ctx is None:
            ctx = contexts[topic] = SerializationContext(topic, MessageField.VALUE)
        framed: bytes = serializer(to_message(doc), ctx)
        return framed

    return encode
