"""Avro Kafka values: Schema Registry framed (confluent-kafka's ``AvroDeserializer``) or plain.

With a registry, each value is ``0x00``, a 4-byte schema id, then Avro binary; the writer
schema is fetched by id (once per worker process) and, with ``reader_schema``, the record is
resolved to that schema by Avro's evolution rules (fields added with defaults, removed, promoted
``int`` -> ``long``...). Without a registry, ``schema_file`` names the writer's ``.avsc`` and
every value is plain Avro binary of one datum (no framing, no schema id).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Protocol, overload, runtime_checkable

from inorder.codecs.base import Codec
from inorder.codecs.registry_base import Msg, RegistryCodec, as_registry
from inorder.codecs.registry_client import SchemaRegistry, registry_client
from inorder.codecs.registry_fast import Deserialize, PayloadDecoder, Prepare
from inorder.errors import ConfigError


@runtime_checkable
class _ResolvedSchemas(Protocol):
    """What the fast path reads from confluent-kafka's ``AvroDeserializer``: the writer schema
    by id through its registry client, parsed (named references resolved) and cached by it,
    and the reader schema it parsed from ``schema_str``."""

    _schema: Any
    _reader_schema: Any

    def _get_writer_schema(self, schema_id: Any, subject: str | None = None) -> Any: ...

    def _get_parsed_schema(self, schema: Any) -> Any: ...


def _avro_prepare(deserializer: _ResolvedSchemas) -> Prepare:
    """Payload decoders from the schemas ``deserializer`` resolved for a writer schema id."""
    from fastavro import schemaless_reader

    def prepare(schema_id: Any) -> PayloadDecoder | None:
        # The deserializer has just decoded a record with this id without a subject, so both
        # lookups hit its caches; the choice of reader schema is the one it makes then.
        writer = deserializer._get_parsed_schema(deserializer._get_writer_schema(schema_id))
        if writer == "bytes" or (isinstance(writer, dict) and writer.get("type") == "bytes"):
            return None  # confluent returns such payloads raw, not through fastavro
        reader = writer
        if deserializer._schema is not None and deserializer._reader_schema is not None:
            reader = deserializer._reader_schema
        if reader == writer:
            reader = None  # what schemaless_reader does itself, decided once

        def decode(value: bytes, start: int) -> Any:
            payload = io.BytesIO(value)
            payload.seek(start)
            return schemaless_reader(payload, writer, reader, False)

        return decode

    return prepare


def read_schema_text(schema: str | Path, option: str) -> str:
    """An Avro/JSON schema given inline (JSON text) or as a file path; checked to be JSON."""
    text = str(schema)
    if not text.lstrip().startswith(("{", "[", '"')):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"codec.{option}: cannot read {str(schema)!r}: {exc}") from None
    try:
        json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"codec.{option}: {str(schema)[:80]!r} is not JSON: {exc}") from None
    return text


class AvroCodec(RegistryCodec[Msg]):
    """Decodes Avro values into ``msg_type`` (dataclass, msgspec.Struct, tagged union, dict).

    ``registry``: a :class:`SchemaRegistry` or its URL, for framed values. ``reader_schema``
    (``.avsc`` path or JSON text): resolve every writer schema to it. ``schema_file``: no
    registry; values are plain Avro binary written with that schema. ``subject_name_strategy``
    (``topic``, ``record``, ``topic_record``) with ``subject_topic`` and ``use_latest_version``:
    read with the subject's latest registered schema instead of a fixed reader schema.
    """

    schema_type = "AVRO"

    @overload
    def __init__(
        self: AvroCodec[Msg],
        msg_type: type[Msg],
        *,
        registry: SchemaRegistry | str | None = None,
        reader_schema: str | Path | None = None,
        schema_file: str | Path | None = None,
        subject_name_strategy: str = "",
        subject_topic: str = "",
        use_latest_version: bool = False,
        strict: bool = True,
        via: Codec[Msg] | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self: AvroCodec[Any],
        msg_type: Any = dict,
        *,
        registry: SchemaRegistry | str | None = None,
        reader_schema: str | Path | None = None,
        schema_file: str | Path | None = None,
        subject_name_strategy: str = "",
        subject_topic: str = "",
        use_latest_version: bool = False,
        strict: bool = True,
        via: Codec[Any] | None = None,
    ) -> None: ...

    def __init__(
        self,
        msg_type: Any = dict,
        *,
        registry: SchemaRegistry | str | None = None,
        reader_schema: str | Path | None = None,
        schema_file: str | Path | None = None,
        subject_name_strategy: str = "",
        subject_topic: str = "",
        use_latest_version: bool = False,
        strict: bool = True,
        via: Codec[Any] | None = None,
    ) -> None:
        resolved = as_registry(registry)
        if (resolved is None) == (schema_file is None):
            raise ConfigError("AvroCodec: give either a registry or a schema_file (not both)")
        super().__init__(
            msg_type,
            registry=resolved,
            strict=strict,
            via=via,
            subject_name_strategy=subject_name_strategy,
            subject_topic=subject_topic,
            use_latest_version=use_latest_version,
        )
        self.reader_schema = (
            read_schema_text(reader_schema, "reader_schema") if reader_schema else None
        )
        self.writer_schema = read_schema_text(schema_file, "schema_file") if schema_file else None
        # Parse now, on the driver, so a broken schema fails the pipeline at start.
        self._check_schemas()

    def _check_schemas(self) -> None:
        from fastavro import parse_schema

        for option, text in (
            ("reader_schema", self.reader_schema),
            ("schema_file", self.writer_schema),
        ):
            if text is not None:
                try:
                    parse_schema(json.loads(text))
                except Exception as exc:
                    raise ConfigError(f"codec.{option}: not a valid Avro schema: {exc}") from None

    def _settings(self) -> tuple[Any, ...]:
        return (
            *super()._settings(),
            self.reader_schema,
            self.writer_schema,
        )

    #: confluent's AvroDeserializer refuses values of 5 bytes or fewer before reading them.
    _min_length = 6

    def _paths(self) -> tuple[Deserialize, Prepare | None]:
        if self.registry is None:
            return self._build_plain(), None
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        deserializer = AvroDeserializer(
            registry_client(self.registry),
            schema_str=self.reader_schema,
            conf=self._subject_config(),
        )
        ctx = self._context()

        def deserialize(value: bytes) -> Any:
            return deserializer(value, ctx)

        if not isinstance(deserializer, _ResolvedSchemas):
            return deserialize, None  # a confluent-kafka without these: its deserializer only
        return deserialize, _avro_prepare(deserializer)

    def _build_plain(self) -> Deserialize:
        from fastavro import parse_schema, schemaless_reader

        assert self.writer_schema is not None
        writer = parse_schema(json.loads(self.writer_schema))
        reader = parse_schema(json.loads(self.reader_schema)) if self.reader_schema else None

        def deserialize(value: bytes) -> Any:
            buffer = io.BytesIO(value)
            datum = schemaless_reader(buffer, writer, reader)
            if buffer.tell() != len(value):
                raise ValueError(f"{len(value) - buffer.tell()} bytes after the Avro datum")
            return datum

        return deserialize
