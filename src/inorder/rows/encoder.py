"""Rows of a record type <-> Arrow record batches, column-wise, exact or refused.

:class:`RowEncoder` encodes a processor's output rows (adding the origin columns) and says
which row does not fit (:meth:`RowEncoder.row_problem`); :func:`decode_rows` reads them back.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import pyarrow as pa

from inorder.rows.arrow_mapping import (
    Conv,
    Node,
    NullValue,
    RowError,
    check_reserved,
    checked,
    constructor,
    full_schema,
    identity,
    root_nodes,
)
from inorder.rows.record_types import FieldSpec, prepare_for_pickling, type_name

T = TypeVar("T")
_NONE = frozenset({type(None)})


# ---------------------------------------------------------------------------------------------
# Encoding and decoding rows


class RowEncoder(Generic[T]):
    """Encodes rows of one output type into Arrow record batches, column-wise.

    The type is analysed once at construction (raising ``ConfigError`` for unmappable fields
    or fields named like the engine's own columns); encoding then reads one attribute per
    field across all rows and lets pyarrow build each column.
    """

    def __init__(self, tp: type[T]) -> None:
        nodes = root_nodes(tp)
        self._tp = tp
        self._schema = pa.schema([pa.field(f.name, n.type, nullable=n.nullable) for f, n in nodes])
        check_reserved(tp, self._schema)
        self._output_schema = full_schema(self._schema)
        self._columns = [
            (f.name, operator.attrgetter(f.name), n.enc, n.type, n.nullable) for f, n in nodes
        ]
        self._fits = {f.name: n.fit for f, n in nodes}
        owner = tp.__qualname__
        # Per row: primitive columns by kind (and range), the others through their converter.
        self._checks = [
            (
                f"{owner}.{f.name}",
                operator.attrgetter(f.name),
                n.fit.kinds if n.fit is not None else frozenset(),
                n.fit.bounds if n.fit is not None else None,
                n.fit,
                None if n.fit is not None else checked(n, f"{owner}.{f.name}"),
                n.nullable,
            )
            for f, n in nodes
        ]
        self._all_fit = _compile_fit_check(tp, nodes)

    def __reduce__(self) -> tuple[Any, ...]:
        # Ship only the type; the converters are rebuilt where the encoder is unpickled.
        prepare_for_pickling(self._tp)
        return (RowEncoder, (self._tp,))

    @property
    def row_type(self) -> type[T]:
        """The row type this encoder was built for."""
        return self._tp

    @property
    def schema(self) -> pa.Schema:
        """The row type's own schema (no origin/batch columns)."""
        return self._schema

    @property
    def output_schema(self) -> pa.Schema:
        """``ORIGIN_FIELDS`` + :attr:`schema` + ``BATCH_ID_FIELD``."""
        return self._output_schema

    def row_problem(self, rows: Sequence[Any]) -> str | None:
        """Why a row does not fit the output schema exactly, or ``None`` when all do.

        The engine calls it on the rows of every ``process`` call, so a bad value is a
        ``row_schema`` violation of that record (handled by the integrity policy) rather than a
        value pyarrow would coerce or a failure of the whole batch later.
        """
        if self._all_fit(rows):
            return None
        return self._explain(rows)

    def _explain(self, rows: Sequence[Any]) -> str | None:
        for i, row in enumerate(rows):
            if type(row) is not self._tp and not isinstance(row, self._tp):
                return f"row {i} is a {type(row).__name__}, not a {self._tp.__qualname__}"
            for path, get, kinds, bounds, fit, conv, nullable in self._checks:
                value = get(row)
                if type(value) in kinds and (bounds is None or bounds[0] <= value <= bounds[1]):
                    continue
                if value is None:
                    if nullable:
                        continue
                    return f"{path}: None in a non-nullable field (declare it 'X | None')"
                if fit is not None:
                    problem = fit.problem(value)
                    if problem is not None:
                        return f"{path}: {problem}"
                    continue
                try:
                    if conv is not None:
                        conv(value)
                except NullValue as exc:
                    return f"{exc.path}: None in a non-nullable field (declare it 'X | None')"
                except (TypeError, ValueError, AttributeError) as exc:
                    text = str(exc)
                    return text if text.startswith(path) else f"{path}: {text}"
        return None

    def encode_columns(self, rows: Sequence[T]) -> dict[str, pa.Array]:
        """One validated Arrow array per field of the row type, in schema order.

        Raises :class:`RowError` naming the field (and row, when known) of a value that does
        not fit, e.g. ``None`` in a field not declared ``X | None``.
        """
        owner = self._tp.__qualname__
        out: dict[str, pa.Array] = {}
        for name, get, enc, arrow, nullable in self._columns:
            values = list(map(get, rows))
            fit = self._fits[name]
            if fit is not None and not set(map(type, values)) <= fit.kinds | _NONE:
                for index, v in enumerate(values):
                    problem = None if v is None else fit.problem(v)
                    if problem is not None:
                        raise RowError(f"{owner}.{name}: {problem} (row {index})", name, index)
            if enc is not None:
                try:
                    values = [None if v is None else enc(v) for v in values]
                except NullValue as exc:
                    row = _first_row(rows, get, enc)
                    raise RowError(
                        f"{exc.path}: None in a non-nullable field (row {row}); "
                        "declare it 'X | None' if it may be missing",
                        exc.path,
                        row,
                    ) from None
                except (TypeError, ValueError, AttributeError) as exc:
                    row = _first_row(rows, get, enc)
                    raise RowError(f"{owner}.{name}: {exc} (row {row})", name, row) from None
            try:
                array = pa.array(values, type=arrow)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
                for index, v in enumerate(values if fit is not None else ()):
                    problem = None if v is None or fit is None else fit.problem(v)
                    if problem is not None:  # e.g. an int beyond the column's width
                        raise RowError(
                            f"{owner}.{name}: {problem} (row {index})", name, index
                        ) from None
                row = _first_unfit(values, arrow)
                raise RowError(
                    f"{owner}.{name}: value does not fit {arrow} (row {row}): {exc}", name, row
                ) from None
            if not nullable and array.null_count:
                row = values.index(None)
                raise RowError(
                    f"{owner}.{name}: None in a non-nullable field (row {row}); "
                    "declare it 'X | None' if it may be missing",
                    f"{owner}.{name}",
                    row,
                )
            out[name] = array
        return out

    def encode(self, rows: Sequence[T]) -> pa.RecordBatch:
        """Rows as a record batch with :attr:`schema`."""
        columns = self.encode_columns(rows)
        return pa.RecordBatch.from_arrays(list(columns.values()), schema=self._schema)

    def encode_with_origin(
        self,
        rows: Sequence[T],
        topic: str,
        partition: int,
        offsets: Sequence[int],
        batch_id: int,
    ) -> pa.RecordBatch:
        """Rows as a record batch with :attr:`output_schema`.

        ``offsets`` holds the Kafka offset of the record that produced each row (one per row);
        ``topic``, ``partition`` and ``batch_id`` are the same for all rows.
        """
        return self.encode_runs(rows, [(topic, partition, len(rows))], offsets, batch_id)

    def encode_runs(
        self,
        rows: Sequence[T],
        runs: Sequence[tuple[str, int, int]],
        offsets: Sequence[int],
        batch_id: int,
    ) -> pa.RecordBatch:
        """Rows of several topic-partitions as one record batch with :attr:`output_schema`.

        ``runs`` holds ``(topic, partition, count)`` of consecutive rows, in the order of
        ``rows``; ``offsets`` the Kafka offset of the record that produced each row.
        """
        n = len(rows)
        if len(offsets) != n or sum(count for _, _, count in runs) != n:
            raise ValueError(
                f"encode_runs: {n} rows but {len(offsets)} offsets and "
                f"{sum(count for _, _, count in runs)} rows in runs"
            )
        columns = self.encode_columns(rows)
        if len(runs) == 1:
            topic, partition, _ = runs[0]
            topics = pa.repeat(pa.scalar(topic, pa.string()), n)
            partitions = pa.repeat(pa.scalar(partition, pa.int32()), n)
        else:
            index = pa.array([i for i, (_, _, count) in enumerate(runs) for _ in range(count)])
            topics = pa.array([t for t, _, _ in runs], pa.string()).take(index)
            partitions = pa.array([p for _, p, _ in runs], pa.int32()).take(index)
        arrays = [
            topics,
            partitions,
            pa.array(offsets, type=pa.int64()),
            *columns.values(),
            pa.repeat(pa.scalar(batch_id, pa.int64()), n),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self._output_schema)


def _first_row(rows: Sequence[Any], get: Conv, enc: Conv) -> int | None:
    """Index of the first row whose value ``enc`` rejects (only run once encoding failed)."""
    for i, row in enumerate(rows):
        v = get(row)
        if v is None:
            continue
        try:
            enc(v)
        except Exception:
            return i
    return None


def _first_unfit(values: list[Any], arrow: pa.DataType) -> int | None:
    """Index of the first value pyarrow cannot convert (only run once a column failed)."""
    for i, v in enumerate(values):
        try:
            pa.array([v], type=arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            return i
    return None


def _compile_fit_check(
    tp: type[Any], nodes: list[tuple[FieldSpec, Node]]
) -> Callable[[Sequence[Any]], bool]:
    """A function telling, fast, whether every row fits exactly (details: ``_explain``).

    Generated code, because this runs for every row the engine emits: straight-line exact
    type tests per field cost a fraction of a generic loop over field descriptors.
    """
    env: dict[str, Any] = {"T": tp}
    lines = ["def all_fit(rows):", "    for row in rows:", "        if type(row) is not T:"]
    lines.append("            return False")
    for i, (f, n) in enumerate(nodes):
        lines.append(f"        v = row.{f.name}")
        none_ok = "v is not None and " if n.nullable else ""
        if n.fit is not None:
            kinds = sorted(n.fit.kinds, key=lambda k: k.__name__)
            test = " and ".join(f"type(v) is not K{i}_{j}" for j in range(len(kinds)))
            for j, kind in enumerate(kinds):
                env[f"K{i}_{j}"] = kind
            if n.fit.bounds is not None:
                low, high = n.fit.bounds
                test = f"({test} or not ({low} <= v <= {high}))"
            lines += [f"        if {none_ok}{test}:", "            return False"]
        else:
            env[f"C{i}"] = checked(n, f.name)
            lines += ["        try:", f"            C{i}(v)", "        except Exception:"]
            lines.append("            return False")
    lines.append("    return True")
    exec("\n".join(lines), env)  # built only from the row type's own field names and types
    check: Callable[[Sequence[Any]], bool] = env["all_fit"]
    return check


@functools.lru_cache(maxsize=64)
def row_encoder(tp: type[Any]) -> RowEncoder[Any]:
    """The (shared) encoder of a row type: its analysis is done once per process."""
    return RowEncoder(tp)


def decode_rows(batch: pa.RecordBatch | pa.Table, tp: type[T]) -> list[T]:
    """The rows of ``tp`` in a batch (inverse of :meth:`RowEncoder.encode`).

    Columns not in ``tp`` (e.g. ``topic`` or ``batch_id``) are ignored. Timestamps come back
    as UTC-aware datetimes.
    """
    nodes = root_nodes(tp)
    missing = [f.name for f, _ in nodes if f.name not in batch.schema.names]
    if missing:
        raise ValueError(f"decode_rows: batch has no column {missing[0]!r} for {type_name(tp)}")
    columns: list[list[Any]] = []
    for f, n in nodes:
        values = batch.column(f.name).to_pylist()
        if n.dec is not None:
            dec = n.dec
            values = [None if v is None else dec(v) for v in values]
        columns.append(values)
    names = [f.name for f, _ in nodes]
    if all(f.init for f, _ in nodes):
        return [tp(**dict(zip(names, vals, strict=True))) for vals in zip(*columns, strict=True)]
    build = constructor(tp, [(f, identity) for f, _ in nodes])
    return [build(dict(zip(names, vals, strict=True))) for vals in zip(*columns, strict=True)]
