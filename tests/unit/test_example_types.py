"""The typed example passes ``mypy --strict`` and derives the documented schema."""

from __future__ import annotations

import datetime as dt
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pyarrow as pa

from inorder.processor import Context, processor_types
from inorder.schema import RowEncoder, decode_rows, output_schema

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "typed_processor.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("typed_processor_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_example_passes_mypy_strict() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(EXAMPLE)],
        capture_output=True,
        text=True,
        cwd=EXAMPLE.parents[1],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_catches_a_wrong_output_type(tmp_path: Path) -> None:
    # The check above must be able to fail: yielding the wrong row type is a mypy error.
    broken = EXAMPLE.read_text().replace(
        "yield StatsRow(msg.site, state.count, state.total / state.count, ctx.timestamp)",
        "yield msg",
    )
    assert broken != EXAMPLE.read_text()
    path = tmp_path / "broken_example.py"
    path.write_text(broken)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True,
        text=True,
        cwd=EXAMPLE.parents[1],
        timeout=300,
    )
    assert result.returncode == 1
    assert 'Incompatible types in "yield"' in result.stdout


class FakeContext:
    timestamp = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def test_example_schema_and_processing() -> None:
    ex = load_example()
    types = processor_types(ex.RunningMean())
    assert (types.msg, types.state, types.out) == (ex.Reading, ex.SiteStats, ex.StatsRow)
    schema = output_schema(ex.StatsRow)
    assert schema.names == [
        "topic", "partition", "offset", "site", "count", "mean", "seen_at", "batch_id",
    ]  # fmt: skip
    assert schema.field("seen_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("seen_at").nullable and not schema.field("mean").nullable

    proc = ex.RunningMean()
    state = proc.initial_state("s1")
    ctx = cast(Context, FakeContext())
    rows: list[Any] = []
    for raw in (b'{"site":"s1","value":1.0}', b'{"site":"s1","value":3.0,"unit":"C"}'):
        rows += proc.process(state, ex.CODEC.decode(raw, None), ctx)
    assert state == ex.SiteStats(2, 4.0, ["C"])
    batch = RowEncoder(ex.StatsRow).encode_with_origin(rows, "readings", 0, [5, 6], 1)
    assert decode_rows(batch, ex.StatsRow) == rows
    assert batch.column("mean").to_pylist() == [1.0, 2.0]
