"""Schema parsing and compatibility checks of the local schema registry, per format.

The registry (:mod:`inorder.dev.registry_store`) asks two things of a schema: is it valid
(:func:`check_schema`), and can one schema read what another wrote (:func:`incompatibilities`).
Compatibility *levels* (BACKWARD, FORWARD, FULL and their transitive forms) are built from the
second question by the store; here each format answers it as honestly as it can:

* **Avro**: Avro's own reader/writer resolution rules, by the ``avro`` package's
  ``ReaderWriterCompatibilityChecker`` (the Java registry applies the same rules): a reader
  field without a default that the writer lacks, a type that does not promote, a missing enum
  symbol or union branch, a changed record name.
* **Protobuf**: the wire-level rules of the Confluent registry that matter for decoding: a
  message type removed, a field's wire type changed (``int32`` to ``string``; the integer
  kinds that share the varint encoding stay compatible, as do ``string`` and ``bytes``), a
  field's message or enum type changed, a ``required`` field added or removed, the package
  changed. Field renames, added and removed optional fields are compatible.
* **JSON Schema**: a subset of the Confluent rules, on the top-level object and its
  properties: the ``type`` of the document or of a property narrowed, a property the reader
  requires that the writer does not, a property the writer may send that the reader forbids
  (``additionalProperties: false``). Everything else is treated as compatible.

Every incompatibility is one line naming the field or type concerned.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any

#: The schema types this registry accepts, as the REST API names them.
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")


class InvalidSchema(ValueError):
    """A schema that does not parse: the message says what is wrong with it."""


# --------------------------------------------------------------------------- parsing


def check_schema(schema_type: str, text: str, references: Mapping[str, str]) -> None:
    """Raise :class:`InvalidSchema` unless ``text`` is a valid schema of ``schema_type``.

    ``references``: the text of every referenced schema by its reference name.
    """
    if schema_type == "AVRO":
        _avro(text, references)
    elif schema_type == "JSON":
        _json_schema(text)
    elif schema_type == "PROTOBUF":
        _proto(text)
    else:
        raise InvalidSchema(f"unknown schema type {schema_type!r} (use AVRO, PROTOBUF or JSON)")


def canonical(schema_type: str, text: str) -> str:
    """The form two registrations are compared in: same canonical form, same schema id."""
    if schema_type in ("AVRO", "JSON"):
        try:
            return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        except json.JSONDecodeError:
            return text.strip()
    return text.strip()


def _avro(text: str, references: Mapping[str, str]) -> Any:
    import avro.errors
    import avro.name
    import avro.schema

    names = avro.name.Names()
    try:
        # Referenced named types first, so the schema can use them by name.
        for name, ref_text in references.items():
            try:
                avro.schema.make_avsc_object(json.loads(ref_text), names)
            except (json.JSONDecodeError, avro.errors.AvroException) as exc:
                raise InvalidSchema(f"referenced Avro schema {name!r}: {exc}") from None
        return avro.schema.make_avsc_object(json.loads(text), names)
    except json.JSONDecodeError as exc:
        raise InvalidSchema(f"Avro schema is not JSON: {exc}") from None
    except avro.errors.AvroException as exc:
        raise InvalidSchema(f"invalid Avro schema: {exc}") from None


def _json_schema(text: str) -> Any:
    import jsonschema

    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSchema(f"JSON Schema is not JSON: {exc}") from None
    if not isinstance(document, (dict, bool)):
        raise InvalidSchema("a JSON Schema is an object or a boolean")
    try:
        jsonschema.validators.validator_for(document).check_schema(document)
    except jsonschema.SchemaError as exc:
        raise InvalidSchema(f"invalid JSON Schema: {exc.message}") from None
    return document


def _proto(text: str) -> Any:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    # confluent-kafka's ProtobufSerializer registers the file as a base64 serialized
    # FileDescriptorProto; parsing .proto text would need protoc, which this registry lacks.
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, DecodeError, ValueError):
        raise InvalidSchema(
            "this local registry keeps Protobuf schemas as base64 serialized "
            "FileDescriptorProto, as confluent-kafka's ProtobufSerializer registers them; "
            ".proto source text is not parsed here"
        ) from None
    if not proto.name and not proto.message_type:
        raise InvalidSchema("Protobuf schema holds no file name and no message type")
    return proto


# --------------------------------------------------------------------------- compatibility


def incompatibilities(
    schema_type: str,
    reader: str,
    writer: str,
    reader_refs: Mapping[str, str],
    writer_refs: Mapping[str, str],
) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can)."""
    if schema_type == "AVRO":
        return _avro_problems(_avro(reader, reader_refs), _avro(writer, writer_refs))
    if schema_type == "JSON":
        return list(_json_problems(_json_schema(reader), _json_schema(writer), "#"))
    if schema_type == "PROTOBUF":
        return list(_proto_problems(_proto(reader), _proto(writer)))
    raise InvalidSchema(f"unknown schema type {schema_type!r}")


def _avro_problems(reader: Any, writer: Any) -> list[str]:
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(reader, writer)
    if result.compatibility == SchemaCompatibilityType.compatible:
        return []
    kinds = [getattr(k, "value", str(k)) for k in result.incompatibilities]
    where = ", ".join(sorted(result.locations)) or "/"
    what = ", ".join(sorted(str(m) for m in result.messages))
    return [f"Avro: {', '.join(kinds)} at {where}" + (f" ({what})" if what else "")]


# Scalar kinds that share an encoding on the wire: a reader can parse the other's bytes.
_WIRE_GROUPS = (
    {"int32", "uint32", "int64", "uint64", "bool"},
    {"sint32", "sint64"},
    {"fixed32", "sfixed32"},
    {"fixed64", "sfixed64"},
    {"string", "bytes"},
)


def _proto_messages(proto: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def walk(prefix: str, messages: Iterable[Any]) -> None:
        for message in messages:
            name = f"{prefix}.{message.name}" if prefix else message.name
            found[name] = message
            walk(name, message.nested_type)

    walk(proto.package, proto.message_type)
    return found


def _field_kind(field: Any) -> str:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto

    name = FieldDescriptorProto.Type.Name(field.type)  # TYPE_INT32
    return str(name)[len("TYPE_") :].lower()


def _proto_problems(reader: Any, writer: Any) -> Iterable[str]:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto

    if reader.package != writer.package:
        yield f"Protobuf: package changed from {writer.package!r} to {reader.package!r}"
    required = FieldDescriptorProto.LABEL_REQUIRED
    ours, theirs = _proto_messages(reader), _proto_messages(writer)
    for name, old in theirs.items():
        new = ours.get(name)
        if new is None:
            yield f"Protobuf: message {name} removed"
            continue
        new_fields = {f.number: f for f in new.field}
        old_fields = {f.number: f for f in old.field}
        for number, before in old_fields.items():
            after = new_fields.get(number)
            where = f"Protobuf: {name} field {number} ({before.name})"
            if after is None:
                if before.label == required:
                    yield f"{where}: required field removed"
                continue
            a, b = _field_kind(after), _field_kind(before)
            if a != b and not any(a in g and b in g for g in _WIRE_GROUPS):
                yield f"{where}: type changed from {b} to {a}"
            elif a in ("message", "enum", "group") and after.type_name != before.type_name:
                yield f"{where}: type changed from {before.type_name} to {after.type_name}"
            if (after.label == required) != (before.label == required):
                yield f"{where}: required changed"
        for number, after in new_fields.items():
            if number not in old_fields and after.label == required:
                yield f"Protobuf: {name} field {number} ({after.name}): required field added"


def _types(schema: Any) -> set[str] | None:
    """The JSON types a schema allows; ``None``: any."""
    if not isinstance(schema, dict) or "type" not in schema:
        return None
    declared = schema["type"]
    kinds = set(declared) if isinstance(declared, list) else {declared}
    if "number" in kinds:
        kinds.add("integer")  # every integer is a number
    return {str(k) for k in kinds}


def _json_problems(reader: Any, writer: Any, where: str) -> Iterable[str]:
    if reader is False and writer is not False:
        yield f"JSON Schema: {where} accepts nothing now"
        return
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return
    wanted, sent = _types(reader), _types(writer)
    if wanted is not None and (sent is None or not sent <= wanted):
        shown = "any type" if sent is None else ", ".join(sorted(sent))
        yield f"JSON Schema: {where} type narrowed: {shown} no longer all accepted"
        return
    reader_props = reader.get("properties") or {}
    writer_props = writer.get("properties") or {}
    newly_required = set(reader.get("required") or []) - set(writer.get("required") or [])
    for name in sorted(newly_required):
        yield f"JSON Schema: {where}/properties/{name} is required now and was not before"
    if reader.get("additionalProperties") is False:
        for name in sorted(set(writer_props) - set(reader_props)):
            yield f"JSON Schema: {where}/properties/{name} removed from a closed object"
        if writer.get("additionalProperties") is not False:
            yield f"JSON Schema: {where} closed to additional properties"
    for name in sorted(set(reader_props) & set(writer_props)):
        yield from _json_problems(
            reader_props[name], writer_props[name], f"{where}/properties/{name}"
        )
