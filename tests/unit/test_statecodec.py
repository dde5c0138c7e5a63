"""State serialisation, fingerprints and state-type evolution."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import pickle
from decimal import Decimal
from typing import Any, Literal, NamedTuple

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

from inorder.errors import ConfigError
from inorder.state.codec import (
    StateCodec,
    check_compatible,
    describe_changes,
    fingerprint,
    validate_state_type,
)

UTC = dt.UTC


def stored(tp: Any) -> dict[str, Any]:
    """The fingerprint as it comes back from a checkpoint (through JSON)."""
    return dict(json.loads(json.dumps(fingerprint(tp))))


# Version 1 of a job's state, and later versions of it. Each test uses old -> new pairs.


@dataclasses.dataclass
class SiteStats:
    count: int = 0
    total: float = 0.0


@dataclasses.dataclass
class SiteStatsAdded:
    count: int = 0
    total: float = 0.0
    last_seen: dt.datetime | None = None
    history: list[float] = dataclasses.field(default_factory=list)
    label: str = "new"


@dataclasses.dataclass
class SiteStatsRequired:
    count: int
    total: float
    site: str


@dataclasses.dataclass
class SiteStatsRetyped:
    total: str = ""


@dataclasses.dataclass
class SiteStatsWidened:
    count: float = 0.0
    total: float | None = None


class Phase(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class PhaseMore(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"
    PAUSED = "paused"


class Item(msgspec.Struct):
    qty: int
    note: str = ""


class Basket(msgspec.Struct):
    items: dict[str, Item] = {}
    phase: Phase = Phase.OPEN
    mode: Literal["a", "b"] = "a"


class Item2(msgspec.Struct):
    qty: str
    note: str = ""


class Basket2(msgspec.Struct):
    items: dict[str, Item2] = {}
    phase: Phase = Phase.OPEN
    mode: Literal["a"] = "a"


class ItemPlus(msgspec.Struct):
    qty: int
    note: str = ""
    price: Decimal = Decimal(0)


class BasketPlus(msgspec.Struct):
    items: dict[str, ItemPlus] = {}
    phase: PhaseMore = PhaseMore.OPEN
    mode: Literal["a", "b", "c"] = "a"


def test_round_trip_dataclass_struct_and_dict() -> None:
    codec = StateCodec(SiteStatsAdded)
    state = SiteStatsAdded(3, 4.5, dt.datetime(2024, 1, 1, tzinfo=UTC), [1.0], "x")
    assert codec.decode(codec.encode(state)) == state
    basket = Basket({"a": Item(2, "n")}, Phase.CLOSED, "b")
    assert StateCodec(Basket).decode(StateCodec(Basket).encode(basket)) == basket
    dict_codec: StateCodec[dict[str, int]] = StateCodec(dict[str, int])
    assert dict_codec.decode(dict_codec.encode({"a": 1})) == {"a": 1}


def test_added_fields_with_defaults_migrate_old_state() -> None:
    old_bytes = StateCodec(SiteStats).encode(SiteStats(3, 4.5))
    check_compatible(stored(SiteStats), SiteStatsAdded)
    assert StateCodec(SiteStatsAdded).decode(old_bytes) == SiteStatsAdded(3, 4.5, None, [], "new")
    changes = describe_changes(stored(SiteStats), SiteStatsAdded)
    assert "field 'history' added (old state gets the default)" in changes


def test_nested_additions_and_new_enum_literal_values_migrate() -> None:
    old_bytes = StateCodec(Basket).encode(Basket({"a": Item(2)}, Phase.CLOSED, "b"))
    check_compatible(stored(Basket), BasketPlus)
    new = StateCodec(BasketPlus).decode(old_bytes)
    assert new == BasketPlus({"a": ItemPlus(2, "", Decimal(0))}, PhaseMore.CLOSED, "b")


def test_removed_field_is_allowed_and_reported() -> None:
    old_bytes = StateCodec(SiteStatsAdded).encode(SiteStatsAdded(1, 2.0, label="x"))
    check_compatible(stored(SiteStatsAdded), SiteStats)
    assert StateCodec(SiteStats).decode(old_bytes) == SiteStats(1, 2.0)
    assert "field 'label' removed (stored values are dropped)" in describe_changes(
        stored(SiteStatsAdded), SiteStats
    )


def test_widening_is_compatible() -> None:
    old_bytes = StateCodec(SiteStats).encode(SiteStats(3, 4.5))
    check_compatible(stored(SiteStats), SiteStatsWidened)
    assert StateCodec(SiteStatsWidened).decode(old_bytes) == SiteStatsWidened(3.0, 4.5)


def test_changed_type_message_says_what_changed() -> None:
    with pytest.raises(ConfigError) as info:
        check_compatible(stored(SiteStats), SiteStatsRetyped)
    assert str(info.value) == (
        "state type SiteStatsRetyped: field 'total' changed type float -> str; "
        "field 'count' removed (stored values are dropped)"
    )
    # And the check is right: the old bytes really do not decode into the new type.
    with pytest.raises(ConfigError, match="stored state does not fit the type"):
        StateCodec(SiteStatsRetyped).decode(StateCodec(SiteStats).encode(SiteStats(1, 2.0)))


def test_added_field_without_default_is_incompatible() -> None:
    with pytest.raises(ConfigError, match="field 'site' added without a default"):
        check_compatible(stored(SiteStats), SiteStatsRequired)


def test_narrowing_optional_is_incompatible() -> None:
    with pytest.raises(ConfigError, match=r"field 'total' changed type float \| None -> float"):
        check_compatible(stored(SiteStatsWidened), SiteStats)


def test_nested_incompatible_changes_name_the_path() -> None:
    with pytest.raises(ConfigError) as info:
        check_compatible(stored(Basket), Basket2)
    message = str(info.value)
    assert message.startswith("state type Basket2: ")
    assert "field 'items{}.qty' changed type int -> str" in message
    assert "field 'mode' changed type Literal['a', 'b'] -> Literal['a']" in message


def test_unchanged_type_is_compatible() -> None:
    check_compatible(stored(Basket), Basket)
    assert describe_changes(stored(Basket), Basket) == []


def test_fingerprint_lists_fields() -> None:
    fp = fingerprint(SiteStatsAdded)
    assert fp["name"] == "SiteStatsAdded"
    assert fp["fields"] == [
        {"name": "count", "type": "int", "has_default": True},
        {"name": "total", "type": "float", "has_default": True},
        {"name": "last_seen", "type": "datetime | None", "has_default": True},
        {"name": "history", "type": "list[float]", "has_default": True},
        {"name": "label", "type": "str", "has_default": True},
    ]
    assert fingerprint(SiteStatsRequired)["fields"][2] == {
        "name": "site",
        "type": "str",
        "has_default": False,
    }


class Renamed(msgspec.Struct, rename="camel"):
    event_count: int = 0


def test_fingerprint_uses_stored_field_names() -> None:
    assert fingerprint(Renamed)["fields"][0]["name"] == "eventCount"


def test_fingerprint_of_other_format_is_rejected() -> None:
    old = stored(SiteStats)
    old["format"] = 99
    with pytest.raises(ConfigError, match="has format 99"):
        check_compatible(old, SiteStats)


@dataclasses.dataclass(frozen=True)
class Frozen:
    count: int = 0


class FrozenStruct(msgspec.Struct, frozen=True):
    count: int = 0


class ArrayLike(msgspec.Struct, array_like=True):
    count: int = 0


class Pair(NamedTuple):
    a: int
    b: int


@dataclasses.dataclass
class HasComplex:
    z: complex = 0j


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (Frozen, "state type Frozen: a frozen dataclass cannot be state"),
        (FrozenStruct, "state type FrozenStruct: a frozen Struct cannot be state"),
        (ArrayLike, "state type ArrayLike: array_like Structs cannot be state"),
        (Pair, "state type Pair: state must be a mutable dataclass"),
        (int, "state type int: state must be a mutable dataclass"),
        (dict[int, int], "state type dict[int, int]: a dict state needs str keys"),
        (HasComplex, "state type HasComplex: field 'z': cannot serialise type 'complex'"),
    ],
)
def test_unsupported_state_types(tp: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_state_type(tp)
    assert str(info.value).startswith(message)
    with pytest.raises(ConfigError):
        StateCodec(tp)


def test_state_codec_pickles() -> None:
    codec = StateCodec(Basket)
    data = codec.encode(Basket({"a": Item(1)}))
    for dumps in (pickle.dumps, cloudpickle.dumps):
        copy = pickle.loads(dumps(codec))
        assert copy.decode(data) == Basket({"a": Item(1)})


def test_pydantic_state() -> None:
    pydantic = pytest.importorskip("pydantic")

    class PState(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        count: int = 0
        seen: list[str] = []

    class PStateAdded(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        count: int = 0
        seen: list[str] = []
        total: float = 0.0

    codec = StateCodec(PState)
    state = PState(count=2, seen=["a"])
    assert codec.decode(codec.encode(state)) == state
    check_compatible(stored(PState), PStateAdded)
    assert StateCodec(PStateAdded).decode(codec.encode(state)) == PStateAdded(count=2, seen=["a"])
    assert fingerprint(PStateAdded)["fields"][2] == {
        "name": "total",
        "type": "float",
        "has_default": True,
    }


@settings(max_examples=50, deadline=None)
@given(
    st.builds(
        SiteStatsAdded,
        count=st.integers(min_value=-(2**63), max_value=2**64 - 1),
        total=st.floats(allow_nan=False),
        last_seen=st.none() | st.datetimes(timezones=st.just(UTC)),
        history=st.lists(st.floats(allow_nan=False), max_size=4),
        label=st.text(max_size=10),
    )
)
def test_round_trip_property(state: SiteStatsAdded) -> None:
    codec = StateCodec(SiteStatsAdded)
    assert codec.decode(codec.encode(state)) == state
    # And the same bytes read by the older type keep the fields it knows.
    assert StateCodec(SiteStats).decode(codec.encode(state)) == SiteStats(state.count, state.total)


def test_copy_is_independent_and_equal() -> None:
    from dataclasses import dataclass, field

    @dataclass
    class Rows:
        rows: dict[str, list[int]] = field(default_factory=dict)
        seq: int = 0

    codec = StateCodec(Rows)
    original = Rows({"a": [1, 2]}, 3)
    copied = codec.copy(original)
    assert copied == original and copied is not original
    copied.rows["a"].append(9)
    copied.seq = 4
    assert original == Rows({"a": [1, 2]}, 3)


def test_copy_of_a_state_the_codec_cannot_take_falls_back_to_deepcopy() -> None:
    from dataclasses import dataclass, field

    @dataclass
    class Loose:
        items: dict[str, Any] = field(default_factory=dict)

    codec = StateCodec(Loose)
    original = Loose({"x": object()})  # msgpack cannot encode it
    copied = codec.copy(original)
    assert copied is not original and copied.items.keys() == original.items.keys()
