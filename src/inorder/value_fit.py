"""Whether a Python value fits an output column exactly: never coerced, never truncated.

pyarrow converts generously: ``32.37`` into an ``int64`` column becomes ``32``, ``True`` into a
``float64`` column ``1.0``, ``b"x"`` into a ``string`` column ``"x"``, a ``datetime`` into a
``date32`` column loses its time. inorder's output is exact, so before a value reaches pyarrow
it must be of the declared kind: an ``int`` field takes integers (not ``bool``, not
``float``) within the column's width; a ``float`` field takes floats and integers (an integer
is exactly representable up to 2**53, as Python's own ``int`` -> ``float`` promotion assumes);
``str`` takes text, ``bytes`` binary, ``bool`` booleans, ``datetime`` datetimes, ``date``
dates that are not datetimes, ``Decimal`` decimals and integers.

:class:`Fit` holds, per primitive column, the exact Python types taken on the fast path (a
``type(v) in kinds`` test) and a slower predicate for subclasses and numpy scalars.
"""

from __future__ import annotations

import datetime as dt
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class Fit:
    """What one primitive column accepts."""

    kinds: frozenset[type]
    """Exact types accepted at once (no range check needed)."""
    accepts: Callable[[Any], bool]
    """Full test, for values whose type is not in :attr:`kinds`."""
    declared: str
    """The declared type, for messages."""
    bounds: tuple[int, int] | None = None
    """Inclusive range of an integer column (checked on the fast path too)."""

    def problem(self, value: Any) -> str | None:
        """Why ``value`` (not None) does not fit, or ``None`` when it does."""
        if type(value) in self.kinds:
            bounds = self.bounds
            if bounds is None or bounds[0] <= value <= bounds[1]:
                return None
        elif self.accepts(value):
            return None
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return f"{type(value).__name__} value {shown} does not fit {self.declared}"


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or type(v).__name__ == "bool_"


def _bounds(bits: int, signed: bool) -> tuple[int, int]:
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


def _integer(low: int, high: int) -> Callable[[Any], bool]:
    def accepts(v: Any) -> bool:
        return isinstance(v, numbers.Integral) and not _is_bool(v) and low <= int(v) <= high

    return accepts


def _real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not _is_bool(v) and not isinstance(v, Decimal)


def _date_only(v: Any) -> bool:
    return isinstance(v, dt.date) and not isinstance(v, dt.datetime)


def _decimal(v: Any) -> bool:
    return isinstance(v, Decimal) or (isinstance(v, numbers.Integral) and not _is_bool(v))


def fit_for(python_type: Any, arrow: pa.DataType) -> Fit | None:
    """The :class:`Fit` of a primitive field (``None`` for types checked elsewhere)."""
    if python_type is int:
        if pa.types.is_integer(arrow):
            low, high = _bounds(arrow.bit_width, pa.types.is_signed_integer(arrow))
            return Fit(frozenset({int}), _integer(low, high), f"int ({arrow})", (low, high))
        if pa.types.is_floating(arrow):
            return Fit(frozenset({int}), _real, f"int ({arrow})")
        return None
    if python_type is float:
        return Fit(frozenset({float, int}), _real, f"float ({arrow})")
    if python_type is str:
        return Fit(frozenset({str}), lambda v: isinstance(v, str), f"str ({arrow})")
    if python_type is bytes:
        return Fit(
            frozenset({bytes}),
            lambda v: isinstance(v, bytes | bytearray | memoryview),
            f"bytes ({arrow})",
        )
    if python_type is bool:
        return Fit(frozenset({bool}), _is_bool, f"bool ({arrow})")
    if python_type is dt.datetime:
        return Fit(
            frozenset({dt.datetime}), lambda v: isinstance(v, dt.datetime), f"datetime ({arrow})"
        )
    if python_type is dt.date:
        return Fit(frozenset({dt.date}), _date_only, f"date ({arrow})")
    if python_type is Decimal:
        return Fit(frozenset({Decimal, int}), _decimal, f"Decimal ({arrow})")
    return None
