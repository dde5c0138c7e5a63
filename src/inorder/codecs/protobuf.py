"""Protobuf Kafka values: Schema Registry framed (confluent-kafka's ``ProtobufDeserializer``)
or plain serialized messages.

The message type is a generated class (``message=``) or a compiled descriptor set
(``protoc --include_imports --descriptor_set_out=x.desc``) with the message's full name. Either
way the codec pickles the descriptors, not the class, and each worker rebuilds the class once.
With a registry, values carry the framing (magic byte, schema id, message indexes) and the
writer schema is fetched by id (so an unknown id is reported); without one, values are the
plain serialized message.

Messages become plain data field by field (proto names; 64-bit integers stay integers;
unset ``optional``/message fields are ``None``; enums by name; ``Timestamp`` as a UTC
``datetime``), then the processor's message type.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC
from operator import attrgetter
from pathlib import Path
from typing import Any

from inorder.codecs.base import Codec
from inorder.codecs.registry_base import Msg, RegistryCodec, as_registry
from inorder.codecs.registry_client import SchemaRegistry, registry_client
from inorder.codecs.registry_fast import Deserialize, PayloadDecoder, Prepare
from inorder.errors import ConfigError

_MESSAGE = 10  # FieldDescriptor.CPPTYPE_MESSAGE
_ENUM = 8  # FieldDescriptor.CPPTYPE_ENUM


def _descriptor_set(message: Any) -> bytes:
    """A FileDescriptorSet holding ``message``'s file and everything it imports."""
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(file: Any) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            add(dependency)
        file.CopyToProto(files.file.add())

    add(message.DESCRIPTOR.file)
    return bytes(files.SerializeToString())


def message_class(descriptor_set: bytes, name: str) -> Any:
    """The message class ``name`` built from a serialized FileDescriptorSet."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    try:
        descriptor = pool.FindMessageTypeByName(name)
    except KeyError:
        names = [f"{f.package}.{m.name}".lstrip(".") for f in files.file for m in f.message_type]
        raise ConfigError(
            f"codec.message_name {name!r} is not in the descriptor set "
            f"(messages: {', '.join(names) or 'none'})"
        ) from None
    return message_factory.GetMessageClass(descriptor)


def to_plain(msg: Any) -> dict[str, Any]:
    """A Protobuf message as plain Python data (see the module docstring for the rules)."""
    plan = _PLANS.get(msg.DESCRIPTOR)
    if plan is None:
        plan = _PLANS.setdefault(msg.DESCRIPTOR, _Plan(msg.DESCRIPTOR))
    return plan(msg)


#: How to turn one field's attribute value into plain data (None: as it is).
_Fix = Callable[[Any, Any], Any]


class _Plan:
    """``to_plain`` for one message type, worked out once from its descriptor.

    Reading every field with one ``attrgetter`` and fixing up only the fields that need it
    (presence, enums, messages, repeated and map fields) costs a fraction of walking the
    descriptor's fields for every record.
    """

    __slots__ = ("_fixes", "_get", "_names")

    def __init__(self, descriptor: Any) -> None:
        names = self._names = tuple(field.name for field in descriptor.fields)
        self._get: Callable[[Any], tuple[Any, ...]]
        if len(names) > 1:
            self._get = attrgetter(*names)
        else:  # attrgetter of one name returns the value itself, not a 1-tuple
            self._get = lambda msg: tuple(getattr(msg, name) for name in names)
        self._fixes = tuple(
            (index, fix)
            for index, field in enumerate(descriptor.fields)
            if (fix := _fix(field)) is not None
        )

    def __call__(self, msg: Any) -> dict[str, Any]:
        values = self._get(msg)
        if not self._fixes:
            return dict(zip(self._names, values, strict=False))  # same length: one per field
        fixed = list(values)
        for index, fix in self._fixes:
            fixed[index] = fix(msg, fixed[index])
        return dict(zip(self._names, fixed, strict=False))


_PLANS: dict[Any, _Plan] = {}


def _fix(field: Any) -> _Fix | None:
    """The conversion ``field``'s value needs (None: a scalar without presence, as it is)."""
    name = field.name
    cpp = field.cpp_type
    if cpp == _MESSAGE:
        entry = field.message_type
        if entry.GetOptions().map_entry:
            inner = entry.fields_by_name["value"]
            if inner.cpp_type == _MESSAGE:
                return lambda msg, value: {k: _message(v) for k, v in value.items()}
            if inner.cpp_type == _ENUM:
                names = _enum_names(inner)
                return lambda msg, value: {k: names.get(v, v) for k, v in value.items()}
            return lambda msg, value: dict(value)
        if field.is_repeated:
            return lambda msg, value: [_message(v) for v in value]
        return lambda msg, value: _message(value) if msg.HasField(name) else None
    if field.is_repeated:
        if cpp == _ENUM:
            names = _enum_names(field)
            return lambda msg, value: [names.get(v, v) for v in value]
        return lambda msg, value: value[:]  # a list; list(value) is twice as slow on upb
    if cpp == _ENUM:
        names = _enum_names(field)
        if field.has_presence:
            return lambda msg, value: names.get(value, value) if msg.HasField(name) else None
        return lambda msg, value: names.get(value, value)
    if field.has_presence:
        return lambda msg, value: value if msg.HasField(name) else None
    return None


def _message(msg: Any) -> Any:
    if msg.DESCRIPTOR.full_name == "google.protobuf.Timestamp":
        return msg.ToDatetime(tzinfo=UTC)
    return to_plain(msg)


def _enum_names(field: Any) -> dict[int, str]:
    """An enum field's value names by number (unknown numbers stay numbers)."""
    return {number: value.name for number, value in field.enum_type.values_by_number.items()}


class ProtobufCodec(RegistryCodec[Msg]):
    """Decodes Protobuf values into ``msg_type`` (dataclass, msgspec.Struct, dict).

    Give the message as a generated class (``message=``) or as ``descriptor_set`` (path or
    bytes of a compiled FileDescriptorSet) plus ``message_name`` (its full name). With
    ``registry`` values are framed; without, they are plain serialized messages.
    """

    schema_type = "PROTOBUF"

    def __init__(
        self,
        msg_type: Any = dict,
        *,
        message: Any = None,
        descriptor_set: str | Path | bytes | None = None,
        message_name: str = "",
        registry: SchemaRegistry | str | None = None,
        strict: bool = True,
        via: Codec[Any] | None = None,
        subject_name_strategy: str = "",
        subject_topic: str = "",
        use_latest_version: bool = False,
    ) -> None:
        super().__init__(
            msg_type,
            registry=as_registry(registry),
            strict=strict,
            via=via,
            subject_name_strategy=subject_name_strategy,
            subject_topic=subject_topic,
            use_latest_version=use_latest_version,
        )
        if (message is None) == (descriptor_set is None):
            raise ConfigError(
                "ProtobufCodec: give either message (a generated class) or descriptor_set "
                "with message_name"
            )
        if message is not None:
            if not hasattr(message, "DESCRIPTOR"):
                raise ConfigError(
                    f"codec.message_type: {message!r} is not a Protobuf message class"
                )
            self.descriptor_set = _descriptor_set(message)
            self.message_name = message.DESCRIPTOR.full_name
        else:
            if not message_name:
                raise ConfigError("codec.descriptor_set needs codec.message_name")
            if isinstance(descriptor_set, bytes):
                self.descriptor_set = descriptor_set
            else:
                try:
                    self.descriptor_set = Path(str(descriptor_set)).read_bytes()
                except OSError as exc:
                    raise ConfigError(
                        f"codec.descriptor_set: cannot read {str(descriptor_set)!r}: {exc}"
                    ) from None
            self.message_name = message_name
        try:
            message_class(self.descriptor_set, self.message_name)  # fail at start, on the driver
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"codec.descriptor_set: not a usable descriptor set: {exc}") from None

    def _settings(self) -> tuple[Any, ...]:
        return (*super()._settings(), self.descriptor_set, self.message_name)

    def _paths(self) -> tuple[Deserialize, Prepare | None]:
        cls = message_class(self.descriptor_set, self.message_name)
        if self.registry is None:
            parse: Deserialize = cls.FromString
            return parse, None
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        deserializer = ProtobufDeserializer(
            cls,
            {"use.deprecated.format": False, **self._subject_config()},
            schema_registry_client=registry_client(self.registry),
        )

        ctx = self._context()

        def deserialize(value: bytes) -> Any:
            return deserializer(value, ctx)

        def parse_payload(value: bytes, start: int) -> Any:
            return cls.FromString(value[start:])

        def prepare(schema_id: Any) -> PayloadDecoder:
            # Without a subject the deserializer checks the writer schema and the message
            # indexes (done for this framing) and then always parses into the codec's class.
            return parse_payload

        return deserialize, prepare

    def _plain(self, obj: Any) -> Any:
        return to_plain(obj)
