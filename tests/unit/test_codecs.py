"""JSON and raw codecs: typed decoding, short error reasons, pickling for executors."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Union

import msgspec
import pytest
from pyspark import cloudpickle

from inorder.codecs import Codec, DecodeError, JsonCodec, RawCodec, RawMessage
from inorder.codecs import json as json_codec
from inorder.errors import ConfigError


@dataclasses.dataclass
class Reading:
    site: str
    seq: int
    value: float = 0.0


class Inner(msgspec.Struct):
    a: int


@dataclasses.dataclass
class Outer:
    inner: Inner
    xs: list[int]


class Insert(msgspec.Struct, tag="insert"):
    session: str
    row: dict[str, int]


class Delete(msgspec.Struct, tag="delete"):
    session: str
    id: str


Change = Union[Insert, Delete]  # noqa: UP007 - a runtime union object, as users write it


def test_decodes_into_dataclass() -> None:
    codec: Codec[Reading] = JsonCodec(Reading)
    assert codec.decode(b'{"site":"a","seq":3,"value":1.5}', None) == Reading("a", 3, 1.5)
    assert codec.decode(b'{"site":"a","seq":3}', b"key") == Reading("a", 3, 0.0)


def test_decodes_tagged_union_of_structs() -> None:
    codec: JsonCodec[Change] = JsonCodec(Change)
    assert codec.decode(b'{"type":"insert","session":"s","row":{"x":1}}', None) == Insert(
        "s", {"x": 1}
    )
    assert codec.decode(b'{"type":"delete","session":"s","id":"r"}', None) == Delete("s", "r")
    with pytest.raises(DecodeError, match=r"^invalid value 'upsert' at 'type'$"):
        codec.decode(b'{"type":"upsert","session":"s"}', None)
    with pytest.raises(DecodeError, match=r"^missing field 'type'$"):
        codec.decode(b'{"session":"s"}', None)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "empty value"),
        (b"", "empty value"),
        (b"null", "empty value"),
        (b'{"site":"a",  "seq":1,,}', "invalid JSON at byte 22"),
        (b"\xff", "invalid JSON at byte 0"),
        (b'{"site":"a"', "invalid JSON: truncated"),
        (b'{"site":"a","seq":1} trailing', "invalid JSON at byte 22"),
        (b'{"seq":1}', "missing field 'site'"),
        (b'{"site":"a","seq":"x"}', "expected int for 'seq', got str"),
        (b"[1]", "expected object, got array"),
    ],
)
def test_short_reasons(value: bytes | None, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        JsonCodec(Reading).decode(value, None)
    assert str(info.value) == reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"inner":{},"xs":[]}', "missing field 'inner.a'"),
        (b'{"inner":{"a":1},"xs":[1,"a"]}', "expected int for 'xs[1]', got str"),
        (b'{"inner":null,"xs":[]}', "expected object for 'inner', got null"),
    ],
)
def test_nested_reasons_name_the_path(value: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        JsonCodec(Outer).decode(value, None)
    assert str(info.value) == reason


def test_strict_false_coerces_strings() -> None:
    assert JsonCodec(Reading, strict=False).decode(b'{"site":"a","seq":"7"}', None).seq == 7
    with pytest.raises(DecodeError):
        JsonCodec(Reading).decode(b'{"site":"a","seq":"7"}', None)


def test_unsupported_type_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match="JsonCodec: cannot decode JSON into"):
        JsonCodec(int | str | bytes)


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
def test_codecs_pickle_without_decoder_state(dumps: object) -> None:
    codec = JsonCodec(Change, strict=False)
    codec.decode(b'{"type":"delete","session":"s","id":"r"}', None)  # decoder now cached
    data = dumps(codec)  # type: ignore[operator]
    copy = pickle.loads(data)
    assert copy.strict is False and copy._decoder is None
    assert copy.decode(b'{"type":"delete","session":"s","id":"r"}', None) == Delete("s", "r")
    raw = pickle.loads(dumps(RawCodec()))  # type: ignore[operator]
    assert raw.decode(b"v", b"k") == RawMessage(key=b"k", value=b"v")


def test_decoder_is_cached_per_type() -> None:
    assert json_codec._decoder(Reading, True) is json_codec._decoder(Reading, True)
    assert json_codec._decoder(Reading, True) is not json_codec._decoder(Reading, False)


def test_raw_codec_passes_nulls() -> None:
    assert RawCodec().decode(None, None) == RawMessage(key=None, value=None)
    assert RawCodec().decode(b"\x00", b"k").value == b"\x00"
