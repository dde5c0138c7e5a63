"""The commit proof's row digest: order-independent, additive, stable across physical types,
and changed by any altered value."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest

from inorder.sinks.base import ConsumedOffsets
from inorder.sinks.proof import (
    add_digests,
    consumed_ranges,
    fold_ranges,
    format_digest,
    parse_digest,
    table_digest,
    table_digests,
)


def sample(rows: int = 300, seed: int = 3) -> pa.Table:
    rng = random.Random(seed)
    words = ["", "\x00", "a", "abcdefgh", "abcdefghi", "x" * 40]
    return pa.table(
        {
            "topic": pa.array([rng.choice(["a", "b"]) for _ in range(rows)]),
            "partition": pa.array([rng.randrange(4) for _ in range(rows)], pa.int32()),
            "offset": pa.array(range(rows), pa.int64()),
            "text": pa.array([rng.choice(words) if i % 7 else None for i in range(rows)]),
            "payload": pa.array([f"{i:06d}-" + "y" * rng.randrange(30) for i in range(rows)]),
            "value": pa.array([rng.random() if i % 5 else None for i in range(rows)]),
            "ts": pa.array(range(rows), pa.timestamp("us", tz="UTC")),
            "nested": pa.array([{"k": i % 3} if i % 4 else None for i in range(rows)]),
            "items": pa.array([[i, i + 1] if i % 3 else None for i in range(rows)]),
        }
    )


def test_the_digest_ignores_row_order_and_adds_over_disjoint_rows() -> None:
    table = sample()
    whole = table_digest(table)
    shuffled = list(range(table.num_rows))
    random.Random(1).shuffle(shuffled)
    assert table_digest(table.take(shuffled)) == whole
    parts = [table_digest(table.slice(a, 37)) for a in range(0, table.num_rows, 37)]
    assert add_digests(*parts) == whole
    assert parse_digest(format_digest(whole)) == whole and len(format_digest(whole)) == 16


def test_digests_of_many_tables_in_one_pass_equal_each_tables_own() -> None:
    # A task closes one file per topic: their digests are hashed together, summed apart.
    table = sample(1_000)
    cuts = [0, 0, 1, 1, 5, 300, 300, 999, 1_000, 1_000]
    tables = [table.slice(a, b - a) for a, b in itertools.pairwise(cuts)]
    assert table_digests(tables) == [table_digest(t) for t in tables]
    assert sum(1 for t in tables if t.num_rows == 0) == 4
    assert table_digests(tables[:1]) == [0] and table_digests([]) == []


def test_the_digest_does_not_depend_on_physical_types() -> None:
    table = sample()
    wide = table.set_column(0, "topic", table.column("topic").cast(pa.large_string()))
    wide = wide.set_column(4, "payload", table.column("payload").cast(pa.large_string()))
    assert table_digest(wide) == table_digest(table)
    # One huge value switches the string hash to its other path: the rest hash the same.
    rest = ["abc", "defghijklm", ""] * 10
    mixed = pa.table({"s": ["q" * 100_000, *rest]})
    alone = add_digests(table_digest(mixed.slice(0, 1)), table_digest(pa.table({"s": rest})))
    assert table_digest(mixed) == alone


@pytest.mark.parametrize("column", ["topic", "offset", "text", "payload", "value", "ts", "nested"])
def test_altering_one_value_changes_the_digest(column: str) -> None:
    table = sample()
    values = table.column(column).to_pylist()
    i = next(i for i, v in enumerate(values) if v is not None and i > 10)
    changed: dict[str, object] = {
        "topic": "c",
        "offset": -1,
        "text": "zz",
        "payload": str(values[i]) + "z",
        "value": 2.5,
        "ts": None,
        "nested": {"k": 9},
    }
    values[i] = changed[column]
    index = table.schema.get_field_index(column)
    altered = table.set_column(index, column, pa.array(values, table.schema.field(column).type))
    assert table_digest(altered) != table_digest(table)


def test_a_duplicated_row_changes_the_digest() -> None:
    table = sample()
    assert table_digest(pa.concat_tables([table, table.slice(5, 1)])) != table_digest(table)


def test_ranges_tile_from_where_the_previous_batch_ended() -> None:
    consumed = [ConsumedOffsets("t", 0, 12, 19), ConsumedOffsets("t", 1, None, 4)]
    ranges = consumed_ranges(consumed, {"t/0": 10})
    assert ranges == {"t/0": [10, 20], "t/1": [5, 5]}
    folded = fold_ranges({"t/0": [[0, 10]]}, ranges)
    assert folded == {"t/0": [[0, 20]], "t/1": [[5, 5]]}
    assert fold_ranges(folded, {"t/0": [25, 30]}) == {"t/0": [[0, 20], [25, 30]], "t/1": [[5, 5]]}
