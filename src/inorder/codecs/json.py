"""JSON Kafka values decoded into typed messages with msgspec.

``JsonCodec(Reading)`` decodes each record value (UTF-8 JSON) straight into a ``Reading``:
a dataclass, a ``msgspec.Struct``, a ``NamedTuple``, or a union of tagged Structs
(``Union[Insert, Delete]`` with ``class Insert(msgspec.Struct, tag="insert")``), or any other
type msgspec accepts. Fields are type-checked while parsing; a value that does not fit is a
:class:`~inorder.codecs.base.DecodeError` with a short reason, which the engine reports with the
record's topic, partition and offset.

The msgspec decoder is built on first use and cached per process and type, so the codec pickles
as just its settings (it is shipped to Spark executors with every task).
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Generic, TypeVar, overload

import msgspec

from inorder.codecs.base import DecodeError
from inorder.errors import ConfigError
from inorder.schema import prepare_for_pickling, type_name

Msg = TypeVar("Msg")

# Decoders keyed by message type, then strictness. Weak keys: classes pickled by value (defined
# in a notebook or __main__) arrive as a new class object with each task; a strong cache would
# keep every copy alive for the life of the executor.
_DECODERS: weakref.WeakKeyDictionary[Any, dict[bool, msgspec.json.Decoder[Any]]] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def _decoder(msg_type: Any, strict: bool) -> msgspec.json.Decoder[Any]:
    try:
        by_strict = _DECODERS.get(msg_type)
    except TypeError:  # not weak-referenceable (e.g. a typing.Union): build, don't cache here
        return msgspec.json.Decoder(msg_type, strict=strict)
    if by_strict is not None and strict in by_strict:
        return by_strict[strict]
    decoder = msgspec.json.Decoder(msg_type, strict=strict)
    with _LOCK:
        _DECODERS.setdefault(msg_type, {})[strict] = decoder
    return decoder


class JsonCodec(Generic[Msg]):
    """Decodes UTF-8 JSON values into ``msg_type`` (dataclass, msgspec.Struct, tagged union).

    ``strict=False`` lets msgspec coerce strings to numbers and the like (``"1"`` for an
    ``int`` field). The record key is ignored.
    """

    @overload
    def __init__(self: JsonCodec[Msg], msg_type: type[Msg], *, strict: bool = True) -> None: ...

    @overload
    def __init__(self: JsonCodec[Any], msg_type: Any, *, strict: bool = True) -> None: ...

    def __init__(self, msg_type: Any, *, strict: bool = True) -> None:
        self.msg_type = msg_type
        self.strict = strict
        self._decoder: msgspec.json.Decoder[Any] | None = None
        try:
            # Fail at pipeline start, on the driver, for a type msgspec cannot decode into.
            _decoder(msg_type, strict)
        except TypeError as exc:
            raise ConfigError(
                f"JsonCodec: cannot decode JSON into {type_name(msg_type)}: {exc}"
            ) from None
        prepare_for_pickling(msg_type)

    def __getstate__(self) -> dict[str, Any]:
        prepare_for_pickling(self.msg_type)
        return {"msg_type": self.msg_type, "strict": self.strict}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.msg_type = state["msg_type"]
        self.strict = state["strict"]
        self._decoder = None

    def __repr__(self) -> str:
        return f"JsonCodec({type_name(self.msg_type)}, strict={self.strict})"

    def decode(self, value: bytes | None, key: bytes | None) -> Msg:
        """Decode or raise ``DecodeError`` with a short reason."""
        if not value:
            raise DecodeError("empty value")
        decoder = self._decoder
        if decoder is None:
            decoder = self._decoder = _decoder(self.msg_type, self.strict)
        try:
            msg: Msg = decoder.decode(value)
        except msgspec.ValidationError as exc:
            raise DecodeError(_reason(str(exc))) from None
        except msgspec.DecodeError as exc:
            raise DecodeError(_syntax_reason(str(exc))) from None
        return msg


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_EXPECTED = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_BYTE = re.compile(r"\(byte (?P<pos>\d+)\)")


def _field_path(path: str) -> str:
    """``$.inner.xs[1]`` -> ``inner.xs[1]`` (msgspec's JSONPath, without the root)."""
    return path[1:] if path.startswith(".") else path


def _reason(text: str) -> str:
    """msgspec's validation message, shortened: "expected int for 'seq', got str"."""
    path = ""
    m = _AT.search(text)
    if m:
        path = _field_path(m["path"])
        text = text[: m.start()]
    if (e := _EXPECTED.match(text)) is not None:
        if e["got"] == "null" and not path:
            return "empty value"
        where = f" for '{path}'" if path else ""
        return f"expected {e['want']}{where}, got {e['got']}"
    if (e := _MISSING.match(text)) is not None:
        field = f"{path}.{e['field']}" if path else e["field"]
        return f"missing field '{field}'"
    where = f" at '{path}'" if path else ""
    return f"{text[:1].lower()}{text[1:]}{where}"


def _syntax_reason(text: str) -> str:
    """msgspec's parse error, shortened: "invalid JSON at byte 17"."""
    if text == "Input data was truncated":
        return "invalid JSON: truncated"
    m = _BYTE.search(text)
    if m:
        return f"invalid JSON at byte {m['pos']}"
    return f"invalid JSON: {text}"
