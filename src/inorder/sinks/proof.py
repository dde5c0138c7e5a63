"""What every commit records as its proof: offset ranges consumed and a digest of the rows added.

* **Row digest.** A file's digest is the sum, wrapping at 2^64, of a 64-bit hash of each of
  its rows over the columns the file stores (``topic``, ``partition``, ``offset``, the
  output columns and ``batch_id``; a column the layout keeps in the directory name is
  covered by the file's path instead). A sum does not depend on row order, so a batch's
  digest is the sum of its files' digests and a compacted file's digest is the sum of the
  digests of the files it replaced. It is computed with numpy over whole columns while the
  file is written, and again from the file alone by ``inorder verify --digests``: a row
  altered, added or dropped changes it (a collision needs 64-bit luck). Digests are written
  as 16 lowercase hex digits.
* **Offset ranges.** Per ``"<topic>/<partition>"`` the half-open ``[start, end)`` of offsets
  a batch consumed: ``end`` is one past the highest offset consumed, ``start`` where the
  previous batch left the partition (lowered to the batch's first record when the state was
  rewound below it). Successive batches therefore tile each partition from its start.

The hash is defined here, not borrowed from a library whose hash may change between
releases: a digest written today must verify with any later version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inorder.sinks.base import ConsumedOffsets

#: Rows hashed at a time: bounds the temporary arrays of string columns.
CHUNK_ROWS = 65_536
_MASK = (1 << 64) - 1
_P = np.uint64(0x100000001B3)  # odd, so it has an inverse modulo 2^64
_P_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_NULL = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_K = np.uint64(0xFF51AFD7ED558CCD)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def _name_hash(name: str) -> np.uint64:
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


_POWERS: dict[bool, np.ndarray] = {}


def _powers(n: int, inverse: bool) -> np.ndarray:
    """``P**i`` (or ``P**-i``) modulo 2^64 for ``i < n`` (cached, grown on demand)."""
    have = _POWERS.get(inverse)
    if have is None or len(have) < n:
        size = max(n, 1 << 16, 0 if have is None else 2 * len(have))
        steps = np.full(size, _P_INV if inverse else _P, dtype=np.uint64)
        steps[0] = np.uint64(1)
        with np.errstate(over="ignore"):
            have = np.cumprod(steps, dtype=np.uint64)
        _POWERS[inverse] = have
    return have[:n]


_TAIL_MASKS = np.array([(1 << (8 * r)) - 1 if r else _MASK for r in range(8)], dtype=np.uint64)


def _bytes_hash(arr: pa.Array) -> np.ndarray:
    """A hash of each value's bytes (``arr`` is large_binary).

    A value is read as little-endian 64-bit words (the last one zero-padded), and hashed as
    the polynomial ``sum(word_k * P**k)`` modulo 2^64, mixed with its length. Words rather
    than bytes: numpy then makes a pass per 8 bytes, not per byte.
    """
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data_buf = arr.buffers()[2]
    lo, hi = int(offsets[0]), int(offsets[-1])
    starts = offsets[:-1] - lo
    lengths = offsets[1:] - offsets[:-1]
    mixed_lengths = lengths.astype(np.uint64) * _K
    if data_buf is None or hi == lo:
        return _mix(mixed_lengths)
    data = np.frombuffer(data_buf, dtype=np.uint8)[lo:hi]
    width = -(-int(np.max(lengths)) // 8) * 8
    if n * width <= 4 * (hi - lo) + 4096:
        return _mix(_rows_poly(data, lengths, width) ^ mixed_lengths)
    padded = np.zeros(hi - lo + 8, dtype=np.uint8)
    padded[: hi - lo] = data
    # The 8 bytes starting at every byte position, as one unaligned view (no copy).
    at = np.ndarray(shape=(hi - lo + 1,), dtype="<u8", buffer=padded.data, strides=(1,))
    counts = (lengths + 7) // 8
    first = np.cumsum(counts) - counts  # index of each value's first word
    total = int(counts.sum())
    row = np.repeat(np.arange(n), counts)
    within = np.arange(total, dtype=np.int64) - first[row]
    words = at[starts[row] + 8 * within]
    tails = lengths % 8
    partial = (tails > 0) & (counts > 0)
    words[(first + counts - 1)[partial]] &= _TAIL_MASKS[tails[partial]]
    with np.errstate(over="ignore"):
        np.multiply(words, _powers(total, False), out=words)
        np.cumsum(words, dtype=np.uint64, out=words)
        ends = first + counts
        upto_end = np.where(ends > 0, words[np.maximum(ends - 1, 0)], np.uint64(0))
        upto_start = np.where(first > 0, words[np.maximum(first - 1, 0)], np.uint64(0))
        # Shifted down by P**-first: a value hashes the same wherever it sits in the buffer.
        poly = (upto_end - upto_start) * _powers(total + 1, True)[first]
        return _mix(poly ^ mixed_lengths)


def _rows_poly(data: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """:func:`_bytes_hash`'s polynomial when values have similar lengths: each value copied
    into a zeroed row of ``width`` bytes, the rows read as words (zero words add nothing)."""
    n = len(lengths)
    rows = np.zeros((n, width), dtype=np.uint8)
    size = int(lengths[0])
    if (lengths == size).all():
        rows[:, :size] = data.reshape(n, size)  # fixed-size values: one copy, no mask
    else:
        rows[np.arange(width, dtype=np.int32) < lengths.astype(np.int32)[:, None]] = data
    words = rows.view("<u8")
    powers = _powers(width // 8, False)
    out: np.ndarray = words[:, 0].copy()
    with np.errstate(over="ignore"):
        for k in range(1, width // 8):  # a few columns: one pass over n values each
            out += words[:, k] * powers[k]
    return out


def _strings_hash(arr: pa.Array) -> np.ndarray:
    """:func:`_bytes_hash` of string or binary values, each distinct value hashed once.

    Output strings repeat (topics, keys, operations): Arrow's dictionary encoding costs a
    fraction of hashing every byte. It is skipped when most of the first values are distinct
    (payloads, ids): then the encoding costs more than it saves.
    """
    probe = arr.slice(0, 1024)
    if len(arr) < 64 or len(pc.unique(probe)) * 2 > len(probe):
        return _bytes_hash(pc.cast(arr, pa.large_binary()))  # mostly distinct: hash directly
    encoded = pc.dictionary_encode(arr)
    hashes = _bytes_hash(pc.cast(encoded.dictionary, pa.large_binary()))
    indices = np.asarray(pc.fill_null(encoded.indices, 0), dtype=np.int64)
    out: np.ndarray = hashes[indices] if len(hashes) else np.zeros(len(arr), dtype=np.uint64)
    return out


def _values_hash(arr: pa.Array) -> np.ndarray:
    """A hash of each value of ``arr`` (nulls included), independent of its physical width."""
    t = arr.type
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    if pa.types.is_dictionary(t):
        return _values_hash(arr.dictionary_decode())
    if pa.types.is_null(t):
        return np.full(n, _NULL, dtype=np.uint64)
    valid = None if arr.null_count == 0 else np.asarray(arr.is_valid(), dtype=bool)
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        out = _strings_hash(arr)
    elif pa.types.is_decimal(t):
        out = _bytes_hash(pc.cast(pc.cast(arr, pa.string()), pa.large_binary()))
    elif pa.types.is_floating(t):
        floats = np.asarray(pc.fill_null(pc.cast(arr, pa.float64()), 0.0), dtype=np.float64)
        out = _mix(floats.view(np.uint64))
    elif pa.types.is_boolean(t):
        out = _mix(np.asarray(pc.fill_null(arr, False), dtype=np.uint64))
    elif pa.types.is_unsigned_integer(t):
        out = _mix(np.asarray(pc.fill_null(pc.cast(arr, pa.uint64()), 0), dtype=np.uint64))
    elif (
        pa.types.is_integer(t)
        or pa.types.is_temporal(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_duration(t)
    ):
        if pa.types.is_date32(t):
            arr = pc.cast(arr, pa.int32())
        ints = np.asarray(pc.fill_null(pc.cast(arr, pa.int64()), 0), dtype=np.int64)
        out = _mix(ints.view(np.uint64))
    elif pa.types.is_struct(t):
        out = np.zeros(n, dtype=np.uint64)
        for i, fld in enumerate(t):
            child = arr.field(i)
            out = _combine(out, _values_hash(child), _name_hash(fld.name))
        out = _mix(out)
    else:
        # Lists, maps and other nested types: rare in outputs, hashed through their values'
        # text, which is slower but as stable.
        texts = pa.array([None if v is None else repr(v) for v in arr.to_pylist()], pa.string())
        out = _bytes_hash(pc.cast(texts, pa.large_binary()))
    if valid is not None:
        out = np.where(valid, out, _NULL)
    return out


def _combine(acc: np.ndarray, column: np.ndarray, name: np.uint64) -> np.ndarray:
    """A polynomial over the (already mixed) column hashes; mixed once at the end."""
    with np.errstate(over="ignore"):
        out: np.ndarray = acc * _P + (column ^ name)
    return out


def row_hashes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """The 64-bit hash of every row of ``table`` over all its columns (in schema order)."""
    acc = np.zeros(table.num_rows, dtype=np.uint64)
    for name, column in zip(table.schema.names, table.columns, strict=True):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        acc = _combine(acc, _values_hash(column), _name_hash(name))
    return _mix(acc)


def table_digest(table: pa.Table | pa.RecordBatch) -> int:
    """The order-independent digest of ``table``'s rows (sum of row hashes modulo 2^64)."""
    total = 0
    for start in range(0, table.num_rows, CHUNK_ROWS):
        hashes = row_hashes(table.slice(start, CHUNK_ROWS))
        total = (total + int(hashes.sum(dtype=np.uint64))) & _MASK
    return total


def table_digests(tables: Sequence[pa.Table]) -> list[int]:
    """:func:`table_digest` of each of ``tables`` (one schema), hashed in one pass.

    A row's hash depends on that row alone, so the tables are hashed concatenated and the
    sums taken per table: a task closing hundreds of small files (one per topic) pays the
    per-call cost of hashing once, not once per file.
    """
    filled = [t for t in tables if t.num_rows]
    if len(filled) < 2:
        return [table_digest(t) for t in tables]
    whole = pa.concat_tables(filled)
    hashes = np.concatenate(
        [row_hashes(whole.slice(at, CHUNK_ROWS)) for at in range(0, whole.num_rows, CHUNK_ROWS)]
    )
    sizes = np.array([t.num_rows for t in filled], dtype=np.int64)
    sums = iter(np.add.reduceat(hashes, np.cumsum(sizes) - sizes).tolist())
    return [int(next(sums)) & _MASK if t.num_rows else 0 for t in tables]


def add_digests(*digests: int) -> int:
    """Digests of disjoint sets of rows combined: the digest of their union."""
    return sum(digests) & _MASK


def format_digest(value: int) -> str:
    """A digest as recorded in commit metadata (16 hex digits)."""
    return f"{value & _MASK:016x}"


def parse_digest(text: str) -> int:
    """Inverse of :func:`format_digest`."""
    return int(text, 16)


def consumed_ranges(
    consumed: Iterable[ConsumedOffsets], previous: Mapping[str, int]
) -> dict[str, list[int]]:
    """The ``[start, end)`` each partition's batch consumed, by ``"<topic>/<partition>"``.

    ``previous`` is where the last batch (or a repair) left each partition. A partition
    that has consumed nothing yet is left out: it covers no offset.
    """
    merged: dict[str, tuple[int | None, int]] = {}
    for c in consumed:
        name = f"{c.topic}/{c.partition}"
        first, last = merged.get(name, (None, -1))
        firsts = [f for f in (first, c.first_offset) if f is not None]
        merged[name] = (min(firsts) if firsts else None, max(last, c.last_offset))
    out: dict[str, list[int]] = {}
    for name, (first, last) in sorted(merged.items()):
        if last < 0:
            continue
        end = last + 1
        start = previous.get(name, first if first is not None else end)
        if first is not None:
            start = min(start, first)
        out[name] = [min(start, end), end]
    return out


def fold_ranges(
    pieces: Mapping[str, Sequence[Sequence[int]]], ranges: Mapping[str, Sequence[int]]
) -> dict[str, list[list[int]]]:
    """``pieces`` (per partition, covered ranges in commit order) with one batch's ranges added.

    A range that starts where the last piece ends extends it; any other (a gap, an overlap)
    starts a new piece, so the folded form keeps the evidence a verifier needs.
    """
    out = {name: [list(p) for p in ps] for name, ps in pieces.items()}
    for name, (start, end) in ranges.items():
        have = out.setdefault(name, [])
        if have and have[-1][1] == start:
            have[-1][1] = int(end)
        else:
            have.append([int(start), int(end)])
    return out
