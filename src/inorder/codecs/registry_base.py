"""What the schema-registry codecs share: typed conversion, pickling, lazy deserializers.

A registry codec turns a record into plain Python data with confluent-kafka's deserializer
(dicts, lists, scalars), then into the processor's message type with ``msgspec.convert``
(the same type rules and error texts as :class:`~inorder.codecs.json.JsonCodec`). A processor
that brings its own JSON codec (the session processor) can take the data through that codec
instead (``via=``): it is re-encoded as JSON and decoded with every check that codec makes.

Only settings are pickled; the deserializer (and the registry client behind it) is built on
first use in each worker process. Framed records take confluent's deserializer for the first
record of each writer schema and a cached decoder after (:mod:`inorder.codecs.registry_fast`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from inorder.codecs.base import Codec, DecodeError
from inorder.codecs.json import _reason
from inorder.codecs.registry_client import SchemaRegistry, translate
from inorder.codecs.registry_fast import Deserialize, Prepare, pick_path
from inorder.errors import ConfigError
from inorder.schema import prepare_for_pickling, type_name

Msg = TypeVar("Msg")

_PASS_THROUGH = (dict, Any, object)
#: Deserializers built in this process, by codec settings: tasks of one worker share them.
_BUILT: dict[tuple[Any, ...], Deserialize] = {}
_LOCK = threading.Lock()


#: The subject name strategies a codec can name (confluent-kafka's strategy types).
STRATEGIES = {"topic": "TOPIC", "record": "RECORD", "topic_record": "TOPIC_RECORD"}


def _no_subject(ctx: Any, record_name: Any) -> None:
    return None


def subject_config(strategy: str, use_latest_version: bool) -> dict[str, Any]:
    """The deserializer's subject settings (no strategy: schema by id only, no subject lookups)."""
    if not strategy:
        if use_latest_version:
            raise ConfigError("codec.use_latest_version needs codec.subject_name_strategy")
        return {"subject.name.strategy": _no_subject}
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"codec.subject_name_strategy {strategy!r} must be one of {', '.join(STRATEGIES)}"
        )
    return {
        "subject.name.strategy.type": STRATEGIES[strategy],
        "use.latest.version": use_latest_version,
    }


def serialization_context(strategy: str, topic: str) -> Any:
    """The context a deserializer derives subjects from (None: no subject strategy)."""
    if not strategy:
        return None
    from confluent_kafka.serialization import MessageField, SerializationContext

    if strategy != "record" and not topic:
        raise ConfigError(f"codec.subject_name_strategy {strategy!r} needs codec.subject_topic")
    return SerializationContext(topic, MessageField.VALUE)


def as_registry(registry: SchemaRegistry | str | None) -> SchemaRegistry | None:
    """A :class:`SchemaRegistry` from one, from a URL, or None."""
    if registry is None or isinstance(registry, SchemaRegistry):
        return registry
    return SchemaRegistry(registry)


class RegistryCodec(Generic[Msg]):
    """Base of the Avro, Protobuf and JSON Schema codecs (subclasses build the deserializer).

    ``subject_name_strategy`` (``topic``, ``record``, ``topic_record``; ``subject_topic``
    names the topic for the first and last) with ``use_latest_version``: read every record
    with the subject's latest registered schema. Without a strategy only the writer schema is
    fetched, by id.

    ``msg_type``: the processor's message type (dataclass, msgspec.Struct, tagged union;
    ``dict`` for the decoded data as is). ``strict=False`` lets ``msgspec.convert`` coerce
    (``"1"`` for an ``int`` field). ``via``: a JSON codec the data passes through instead.
    """

    #: confluent-kafka's schema type name (``AVRO``, ``PROTOBUF``, ``JSON``).
    schema_type: ClassVar[str] = ""

    def __init__(
        self,
        msg_type: Any,
        *,
        registry: SchemaRegistry | None,
        strict: bool = True,
        via: Codec[Msg] | None = None,
        subject_name_strategy: str = "",
        subject_topic: str = "",
        use_latest_version: bool = False,
    ) -> None:
        subject_config(subject_name_strategy, use_latest_version)
        serialization_context(subject_name_strategy, subject_topic)
        self.subject_name_strategy = subject_name_strategy
        self.subject_topic = subject_topic
        self.use_latest_version = use_latest_version
        self.msg_type = msg_type
        self.registry = registry
        self.strict = strict
        self.via = via
        self._deserialize: Deserialize | None = None
        self._convert: Callable[[Any, bytes | None], Msg] | None = None
        if via is None and msg_type not in _PASS_THROUGH:
            try:
                msgspec.inspect.type_info(msg_type)
                msgspec.convert({}, msg_type, strict=strict)
            except msgspec.ValidationError:
                pass  # a type msgspec understands; {} merely lacks its fields
            except TypeError as exc:
                raise ConfigError(
                    f"{type(self).__name__}: cannot decode into {type_name(msg_type)}: {exc}"
                ) from None
            prepare_for_pickling(msg_type)

    # -- what subclasses provide ---------------------------------------------------------

    def _settings(self) -> tuple[Any, ...]:
        """Everything that determines the deserializer (hashable): the per-process cache key."""
        return (
            type(self).__name__,
            self.registry,
            self.subject_name_strategy,
            self.subject_topic,
            self.use_latest_version,
        )

    def _subject_config(self) -> dict[str, Any]:
        return subject_config(self.subject_name_strategy, self.use_latest_version)

    def _context(self) -> Any:
        return serialization_context(self.subject_name_strategy, self.subject_topic)

    def _paths(self) -> tuple[Deserialize, Prepare | None]:
        """confluent's deserializer (or, without a registry, the plain decoder) and how to
        build the fast path's payload decoder for a writer schema (None: no fast path)."""
        raise NotImplementedError

    #: Values shorter than this never take the fast path (see ``SchemaCache``).
    _min_length: ClassVar[int] = 0

    def _build(self) -> Deserialize:
        """A function from a record value to plain Python data (or a Protobuf message)."""
        slow, prepare = self._paths()
        return pick_path(
            slow,
            prepare,
            self.schema_type,
            subject_name_strategy=self.subject_name_strategy,
            min_length=self._min_length,
        )

    def _plain(self, obj: Any) -> Any:
        """The deserializer's result as plain Python data (Protobuf messages override)."""
        return obj

    # -- pickling ------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        if self.via is None:
            prepare_for_pickling(self.msg_type)
        state = dict(self.__dict__)
        state["_deserialize"] = None
        state["_convert"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        where = repr(self.registry) if self.registry is not None else "no registry"
        into = repr(self.via) if self.via is not None else type_name(self.msg_type)
        return f"{type(self).__name__}({into}, {where})"

    # -- decoding ------------------------------------------------------------------------

    def _deserializer(self) -> Deserialize:
        key = self._settings()
        found = _BUILT.get(key)
        if found is None:
            with _LOCK:
                found = _BUILT.get(key)
                if found is None:
                    found = _BUILT[key] = self._build()
        self._deserialize = found
        return found

    def _converter(self) -> Callable[[Any, bytes | None], Msg]:
        via = self.via
        convert: Callable[[Any, bytes | None], Msg]
        if via is not None:
            encode = msgspec.json.Encoder().encode

            def convert(obj: Any, key: bytes | None) -> Msg:
                return via.decode(encode(obj), key)

        elif self.msg_type in _PASS_THROUGH:

            def convert(obj: Any, key: bytes | None) -> Msg:
                out: Msg = obj
                return out

        else:
            msg_type, strict = self.msg_type, self.strict

            def convert(obj: Any, key: bytes | None) -> Msg:
                try:
                    out: Msg = msgspec.convert(obj, msg_type, strict=strict)
                except msgspec.ValidationError as exc:
                    raise DecodeError(
                        f"{self.schema_type.lower()} record does not fit "
                        f"{type_name(msg_type)}: {_reason(str(exc))}"
                    ) from None
                return out

        self._convert = convert
        return convert

    def decode(self, value: bytes | None, key: bytes | None) -> Msg:
        """Decode one record value or raise a named ``DecodeError``.

        Raises :class:`~inorder.codecs.registry_errors.RegistryUnavailableError` (not a
        ``DecodeError``: the batch fails) when the registry does not answer.
        """
        if not value:
            raise DecodeError("empty value")
        return self._decode_with(self._deserialize or self._deserializer(), value, key)

    def _decode_with(self, deserialize: Deserialize, value: bytes, key: bytes | None) -> Msg:
        """:meth:`decode` with a given deserializer (tests compare the two paths with it)."""
        try:
            obj = self._plain(deserialize(value))
        except DecodeError:
            raise
        except Exception as exc:
            shown = self.registry.shown_url if self.registry is not None else None
            raise translate(exc, value, self.schema_type, shown) from None
        return (self._convert or self._converter())(obj, key)
