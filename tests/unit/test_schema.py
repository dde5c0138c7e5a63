"""Output type -> Arrow schema derivation, row encoding and decoding."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import re
import sys
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal, NamedTuple, Optional

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inorder.errors import ConfigError
from inorder.records import BATCH_ID_FIELD, ORIGIN_FIELDS
from inorder.schema import (
    DEFAULT_DECIMAL,
    Precision,
    RowEncoder,
    RowError,
    arrow_schema,
    decode_rows,
    output_schema,
)

UTC = dt.UTC


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class Inner:
    a: int
    b: str | None = None


class Point(NamedTuple):
    x: float
    ys: list[int]


class Bag(msgspec.Struct):
    by_name: dict[str, Inner]


@dataclasses.dataclass
class Everything:
    s: str
    i: int
    f: float
    b: bool
    raw: bytes
    ts: dt.datetime
    day: dt.date
    amount: Decimal
    price: Annotated[Decimal, Precision(10, 2)]
    maybe: int | None
    old_style: Optional[str]  # noqa: UP045 - the typing spelling must work too
    tags: list[str]
    counts: dict[str, int]
    inner: Inner
    point: Point
    bag: Bag | None
    kind: Literal["x", "y"]
    color: Color
    level: Level
    nums: tuple[int, ...]
    small: Annotated[int, pa.int32()]
    inners: list[Inner | None]


def test_every_supported_type_maps_to_the_documented_arrow_type() -> None:
    schema = arrow_schema(Everything)
    types = {f.name: f.type for f in schema}
    assert types["s"] == pa.string()
    assert types["i"] == pa.int64()
    assert types["f"] == pa.float64()
    assert types["b"] == pa.bool_()
    assert types["raw"] == pa.binary()
    assert types["ts"] == pa.timestamp("us", tz="UTC")
    assert types["day"] == pa.date32()
    assert types["amount"] == DEFAULT_DECIMAL == pa.decimal128(38, 9)
    assert types["price"] == pa.decimal128(10, 2)
    assert types["maybe"] == pa.int64()
    assert types["tags"] == pa.list_(pa.field("item", pa.string(), nullable=False))
    assert types["counts"] == pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False))
    assert types["inner"] == pa.struct(
        [pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())]
    )
    assert types["point"].field("ys").type == pa.list_(pa.field("item", pa.int64(), nullable=False))
    assert types["bag"].field("by_name").type.item_type == types["inner"]
    assert types["kind"] == pa.string()
    assert types["color"] == pa.string()
    assert types["level"] == pa.int64()
    assert types["nums"] == pa.list_(pa.field("item", pa.int64(), nullable=False))
    assert types["small"] == pa.int32()
    assert types["inners"].value_field.nullable
    nullable = {f.name for f in schema if f.nullable}
    assert nullable == {"maybe", "old_style", "bag"}


def sample() -> Everything:
    return Everything(
        s="a",
        i=-(2**62),
        f=1.5,
        b=True,
        raw=b"\x00\xff",
        ts=dt.datetime(2024, 5, 1, 12, 30, 0, 123456, tzinfo=UTC),
        day=dt.date(2024, 5, 1),
        amount=Decimal("12345.123456789"),
        price=Decimal("9.99"),
        maybe=None,
        old_style="x",
        tags=["t1", "t2"],
        counts={"k": 1},
        inner=Inner(1),
        point=Point(0.5, [1, 2]),
        bag=Bag({"z": Inner(2, "b")}),
        kind="y",
        color=Color.BLUE,
        level=Level.HIGH,
        nums=(3, 4),
        small=7,
        inners=[Inner(3), None],
    )


def test_encode_then_decode_round_trips_every_type() -> None:
    row = sample()
    batch = RowEncoder(Everything).encode([row, row])
    assert batch.num_rows == 2
    assert batch.schema == arrow_schema(Everything)
    assert decode_rows(batch, Everything) == [row, row]
    assert batch.column("color").to_pylist() == ["blue", "blue"]
    assert batch.column("counts").to_pylist() == [[("k", 1)], [("k", 1)]]


def test_naive_datetime_means_utc() -> None:
    row = dataclasses.replace(sample(), ts=dt.datetime(2024, 5, 1, 12, 0))
    plus_two = dt.timezone(dt.timedelta(hours=2))
    aware = dataclasses.replace(sample(), ts=dt.datetime(2024, 5, 1, 14, 0, tzinfo=plus_two))
    batch = RowEncoder(Everything).encode([row, aware])
    back = decode_rows(batch, Everything)
    assert back[0].ts == dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert back[1].ts == dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert back[0].ts.utcoffset() == dt.timedelta(0)


class StructRow(msgspec.Struct):
    site: str
    n: int


class TupleRow(NamedTuple):
    site: str
    n: int


@pytest.mark.parametrize("tp", [StructRow, TupleRow])
def test_struct_and_namedtuple_rows(tp: type[StructRow] | type[TupleRow]) -> None:
    rows = [tp("a", 1), tp("b", 2)]
    batch = RowEncoder(tp).encode(rows)
    assert batch.to_pydict() == {"site": ["a", "b"], "n": [1, 2]}
    assert decode_rows(batch, tp) == rows


def test_pydantic_rows() -> None:
    pydantic = pytest.importorskip("pydantic")

    class PRow(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        site: str
        n: int | None = None

    assert arrow_schema(PRow) == pa.schema(
        [pa.field("site", pa.string(), nullable=False), pa.field("n", pa.int64())]
    )
    rows = [PRow(site="a", n=1), PRow(site="b")]
    assert decode_rows(RowEncoder(PRow).encode(rows), PRow) == rows


@dataclasses.dataclass
class StatsRow:
    site: str
    tags: set[int]


@dataclasses.dataclass
class DeepBad:
    inner: list[dict[str, frozenset[str]]]


@dataclasses.dataclass
class AnyField:
    payload: object


@dataclasses.dataclass
class UnionField:
    v: int | str


@dataclasses.dataclass
class BareList:
    v: list  # type: ignore[type-arg]


@dataclasses.dataclass
class BadKey:
    v: dict[tuple[int, int], int]


@dataclasses.dataclass
class Node:
    children: list[Node]


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        (StatsRow, "StatsRow.tags: cannot map type 'set[int]' to Arrow; use list[int]"),
        (DeepBad, "DeepBad.inner[]{}: cannot map type 'frozenset[str]' to Arrow; use list[str]"),
        (AnyField, "AnyField.payload: cannot map type 'object' to Arrow; give the field a"),
        (UnionField, "UnionField.v: cannot map type 'int | str' to Arrow; a field may hold one"),
        (BareList, "BareList.v: cannot map type 'list' to Arrow; give the element type"),
        (BadKey, "BadKey.v: cannot map type 'dict[tuple[int, int], int]' to Arrow; map keys"),
        (Node, "Node.children[]: cannot map type 'Node' to Arrow; recursive types"),
    ],
)
def test_unmappable_types_name_class_and_field_path(tp: type, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        arrow_schema(tp)
    assert str(info.value).startswith(message)


def test_non_record_type_is_rejected() -> None:
    with pytest.raises(ConfigError, match="int is not a record type"):
        arrow_schema(int)


@dataclasses.dataclass
class HasOffset:
    site: str
    offset: int


def test_output_type_may_not_define_engine_columns() -> None:
    with pytest.raises(ConfigError, match="HasOffset: field 'offset' clashes with a column"):
        output_schema(HasOffset)
    with pytest.raises(ConfigError, match="'offset' clashes"):
        RowEncoder(HasOffset)
    # Plain schema derivation (not as output) still works.
    assert arrow_schema(HasOffset).names == ["site", "offset"]


@dataclasses.dataclass
class Flat:
    site: str
    count: int
    mean: float
    ok: bool


def test_output_schema_is_origin_then_row_then_batch_id() -> None:
    schema = output_schema(Flat)
    assert list(schema)[:3] == list(ORIGIN_FIELDS)
    assert schema.field(len(schema) - 1) == BATCH_ID_FIELD
    assert schema.names == [
        "topic",
        "partition",
        "offset",
        "site",
        "count",
        "mean",
        "ok",
        "batch_id",
    ]


def test_encode_with_origin() -> None:
    enc = RowEncoder(Flat)
    rows = [Flat("a", 1, 1.0, True), Flat("b", 2, 1.5, False)]
    batch = enc.encode_with_origin(rows, "readings", 3, [10, 12], 7)
    assert batch.schema == enc.output_schema == output_schema(Flat)
    assert batch.to_pydict() == {
        "topic": ["readings", "readings"],
        "partition": [3, 3],
        "offset": [10, 12],
        "site": ["a", "b"],
        "count": [1, 2],
        "mean": [1.0, 1.5],
        "ok": [True, False],
        "batch_id": [7, 7],
    }
    assert decode_rows(batch, Flat) == rows
    empty = enc.encode_with_origin([], "readings", 3, [], 7)
    assert empty.num_rows == 0 and empty.schema == enc.output_schema
    with pytest.raises(ValueError, match="2 rows but 1 offsets"):
        enc.encode_with_origin(rows, "readings", 3, [10], 7)


def test_none_in_non_nullable_field_names_field_and_row() -> None:
    enc = RowEncoder(Flat)
    with pytest.raises(RowError, match=r"Flat\.site: None in a non-nullable field \(row 1\)") as e:
        enc.encode([Flat("a", 1, 1.0, True), Flat(None, 2, 1.0, True)])  # type: ignore[arg-type]
    assert e.value.row == 1


def test_none_in_nested_non_nullable_field_names_path() -> None:
    row = dataclasses.replace(sample(), inner=Inner(None))  # type: ignore[arg-type]
    with pytest.raises(RowError, match=r"Everything\.inner\.a: None in a non-nullable field"):
        RowEncoder(Everything).encode([sample(), row])
    row = dataclasses.replace(sample(), tags=["x", None])  # type: ignore[list-item]
    with pytest.raises(RowError, match=r"Everything\.tags\[\]: None in a non-nullable field"):
        RowEncoder(Everything).encode([row])


def test_wrong_value_type_names_field_and_row() -> None:
    with pytest.raises(RowError, match=r"Flat\.count: str value '2' does not fit int.*\(row 1\)"):
        RowEncoder(Flat).encode([Flat("a", 1, 1.0, True), Flat("b", "2", 1.0, True)])  # type: ignore[arg-type]


@dataclass
class Exact:
    n: int
    x: float
    s: str
    b: bytes
    d: dt.date
    small: Annotated[int, pa.int32()]
    ns: list[int]
    opt: int | None = None


def _exact(**changes: Any) -> Exact:
    base = Exact(1, 1.5, "s", b"b", dt.date(2024, 1, 2), 7, [1, 2])
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n": 32.37}, r"Exact\.n: float value 32\.37 does not fit int"),
        ({"n": -2.7}, r"Exact\.n: float value -2\.7 does not fit int"),
        ({"n": 3.0}, r"Exact\.n: float value 3\.0 does not fit int"),
        ({"n": True}, r"Exact\.n: bool value True does not fit int"),
        ({"n": 2**63}, r"Exact\.n: int value 9223372036854775808 does not fit int \(int64\)"),
        ({"small": 2**31}, r"Exact\.small: int value 2147483648 does not fit int \(int32\)"),
        ({"x": True}, r"Exact\.x: bool value True does not fit float"),
        ({"x": "1.5"}, r"Exact\.x: str value '1\.5' does not fit float"),
        ({"s": b"s"}, r"Exact\.s: bytes value b's' does not fit str"),
        ({"b": "b"}, r"Exact\.b: str value 'b' does not fit bytes"),
        ({"d": dt.datetime(2024, 1, 2, 3)}, r"Exact\.d: datetime value .* does not fit date"),
        ({"ns": [1, 2.5]}, r"Exact\.ns\[\]: float value 2\.5 does not fit int"),
        ({"opt": 1.25}, r"Exact\.opt: float value 1\.25 does not fit int"),
        ({"n": None}, r"Exact\.n: None in a non-nullable field"),
    ],
)
def test_values_that_do_not_fit_are_never_coerced(changes: dict[str, Any], message: str) -> None:
    """Before: 32.37 became 32 and -2.7 became -2, silently (pyarrow truncates)."""
    encoder = RowEncoder(Exact)
    row = _exact(**changes)
    problem = encoder.row_problem([row])
    assert problem is not None and re.search(message, problem), problem
    with pytest.raises(RowError, match=message):
        encoder.encode([_exact(), row])


def test_values_that_fit_pass() -> None:
    encoder = RowEncoder(Exact)
    rows = [_exact(), _exact(x=2, opt=None), _exact(small=-(2**31), n=2**63 - 1, opt=5)]
    assert encoder.row_problem(rows) is None
    assert encoder.encode(rows).column("x").to_pylist() == [1.5, 2.0, 1.5]


def test_decimal_that_would_lose_digits_is_an_error() -> None:
    row = dataclasses.replace(sample(), price=Decimal("1.234"))
    with pytest.raises(
        RowError, match=r"Everything\.price: value does not fit decimal128\(10, 2\)"
    ):
        RowEncoder(Everything).encode([row])


def test_literal_and_enum_values_are_checked() -> None:
    row = dataclasses.replace(sample(), kind="z")  # type: ignore[arg-type]
    with pytest.raises(RowError, match=r"Everything\.kind: 'z' is not one of \['x', 'y'\]"):
        RowEncoder(Everything).encode([row])
    row = dataclasses.replace(sample(), color="green")  # type: ignore[arg-type]
    with pytest.raises(RowError, match=r"Everything\.color: 'green' is not a valid Color"):
        RowEncoder(Everything).encode([row])


def test_decode_rows_reports_missing_column() -> None:
    batch = pa.RecordBatch.from_pydict({"site": ["a"]})
    with pytest.raises(ValueError, match="no column 'count' for Flat"):
        decode_rows(batch, Flat)


# Hypothesis: any value the types allow survives encode -> decode_rows unchanged.

texts = st.text(max_size=8)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
floats = st.floats(allow_nan=False)
stamps = st.datetimes(
    min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(UTC)
)
decimals_38_9 = st.decimals(
    min_value=Decimal("-1e20"), max_value=Decimal("1e20"), places=9, allow_nan=False
)
decimals_10_2 = st.decimals(
    min_value=Decimal("-99999999.99"), max_value=Decimal("99999999.99"), places=2
)
inners = st.builds(Inner, a=ints, b=st.none() | texts)
everything = st.builds(
    Everything,
    s=texts,
    i=ints,
    f=floats,
    b=st.booleans(),
    raw=st.binary(max_size=8),
    ts=stamps,
    day=st.dates(),
    amount=decimals_38_9,
    price=decimals_10_2,
    maybe=st.none() | ints,
    old_style=st.none() | texts,
    tags=st.lists(texts, max_size=3),
    counts=st.dictionaries(texts, ints, max_size=3),
    inner=inners,
    point=st.builds(Point, x=floats, ys=st.lists(ints, max_size=3)),
    bag=st.none() | st.builds(Bag, by_name=st.dictionaries(texts, inners, max_size=2)),
    kind=st.sampled_from(["x", "y"]),
    color=st.sampled_from(Color),
    level=st.sampled_from(Level),
    nums=st.lists(ints, max_size=3).map(tuple),
    small=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    inners=st.lists(st.none() | inners, max_size=3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(everything, max_size=5))
def test_round_trip_property(rows: list[Everything]) -> None:
    enc = RowEncoder(Everything)
    batch = enc.encode_with_origin(rows, "t", 0, list(range(len(rows))), 1)
    assert decode_rows(batch, Everything) == rows


def test_check_portable_rejects_structs_pickled_by_value() -> None:
    from pyspark import cloudpickle

    from inorder.schema import check_portable

    check_portable(Everything, Flat, StructRow)  # importable module: pickled by reference
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    try:
        check_portable(Flat)  # dataclasses survive pickling by value
        with pytest.raises(ConfigError, match=r"Bag: a msgspec\.Struct defined in"):
            check_portable(Everything)  # Bag is nested two levels down
    finally:
        cloudpickle.unregister_pickle_by_value(module)  # type: ignore[no-untyped-call]


def test_prepare_for_pickling_resolves_string_annotations() -> None:
    from inorder.schema import prepare_for_pickling

    assert Flat.__annotations__["site"] in ("str", str)
    msgspec.json.Decoder(Flat)  # msgspec caches an unpicklable object on the class
    prepare_for_pickling(Flat)
    assert Flat.__annotations__["site"] is str
    assert "__msgspec_cache__" not in vars(Flat)
