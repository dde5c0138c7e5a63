"""Encode and decode cost of one state file: Parquet (state format 1) against Arrow IPC files.

One core, no Spark: the same state table (``inorder.state.state_table.table_of_rows``: N upserts
with ~60-byte msgpack states, timers and Kafka keys, plus N/10 tombstones) is encoded to bytes
and decoded back, as ``CheckpointStore.write_table`` and ``read_table`` do, by each encoding:
Parquet zstd without statistics or dictionaries (format 1), IPC files uncompressed and with
their buffers lz4 or zstd, and an uncompressed IPC file compressed whole as one zstd stream
(format 2's encoding), single-threaded. Encodings alternate round by round so that drift
(other load) hits all of them; the table shows medians over rounds of the process CPU
microseconds per file (CPU, not wall time: on a shared machine the wall time is mostly
waiting for a core), and the file's bytes.

    .venv/bin/python bench/state_encoding.py [--keys 1,10,40,200,1000,5000,50000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.ipc as paipc
import pyarrow.parquet as pq

from inorder.state.state_table import table_of_rows


def state_table(keys: int) -> pa.Table:
    """A delta of ``keys`` upserts and ``keys // 10`` deletions."""
    enc = msgspec.msgpack.Encoder()
    upserts: list[tuple[str, Any]] = []
    for i in range(keys):
        state = enc.encode({"site": f"s{i % 7}", "count": i, "readings": list(range(7))})
        row = (state, 1000 + i, 1_700_000_000_000_000 + i, f"k{i}".encode(), i, i * 10, 1, False)
        upserts.append((f"key-{i:06d}", row))
    meta = {"version": 12, "epoch": "e" * 32, "meta": {"last_offset": 1234}}
    return table_of_rows(upserts, [f"gone-{i}" for i in range(keys // 10)], meta)


def parquet_codec() -> tuple[Callable[[pa.Table], bytes], Callable[[bytes], pa.Table]]:
    """Format 1's encoding."""

    def encode(table: pa.Table) -> bytes:
        buffer = io.BytesIO()
        pq.write_table(
            table, buffer, compression="zstd", write_statistics=False, use_dictionary=False
        )
        return buffer.getvalue()

    def decode(data: bytes) -> pa.Table:
        return pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)

    return encode, decode


def ipc_codec(
    compression: str | None,
) -> tuple[Callable[[pa.Table], bytes], Callable[[bytes], pa.Table]]:
    """An IPC file, with ``compression`` of its buffers."""
    options = paipc.IpcWriteOptions(compression=compression, use_threads=False)
    read_options = paipc.IpcReadOptions(use_threads=False)

    def encode(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with paipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        data: bytes = sink.getvalue().to_pybytes()
        return data

    def decode(data: bytes) -> pa.Table:
        table = paipc.open_file(pa.BufferReader(data), options=read_options).read_all()
        table.validate(full=True)
        return table

    return encode, decode


def format2_codec() -> tuple[Callable[[pa.Table], bytes], Callable[[bytes], pa.Table]]:
    """Format 2's encoding: an uncompressed IPC file, compressed whole as one zstd stream."""
    from inorder.state.checkpoint import IPC_SUFFIX, decode_state_file, encode_state_file

    def decode(data: bytes) -> pa.Table:
        return decode_state_file(f"x{IPC_SUFFIX}", data)

    return encode_state_file, decode


def _us(fn: Callable[[Any], Any], arg: Any, reps: int) -> float:
    started = time.process_time()
    for _ in range(reps):
        fn(arg)
    return (time.process_time() - started) / reps * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1,10,40,200,1000,5000,50000")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    codecs = {
        "Parquet zstd (format 1)": parquet_codec(),
        "IPC uncompressed": ipc_codec(None),
        "IPC lz4": ipc_codec("lz4"),
        "IPC zstd": ipc_codec("zstd"),
        "IPC, the whole file zstd (format 2)": format2_codec(),
    }
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| keys | encoding | bytes | encode µs CPU | decode µs CPU |\n|---:|---|---:|---:|---:|")
    for keys in (int(k) for k in args.keys.split(",")):
        table = state_table(keys)
        reps = max(3, min(500, 20_000 // max(keys, 1)))
        times: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in codecs}
        sizes: dict[str, int] = {}
        for round_no in range(args.rounds):
            names = list(codecs)
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                encode, decode = codecs[name]
                data = encode(table)
                assert decode(data).equals(table, check_metadata=True), name
                sizes[name] = len(data)
                times[name][0].append(_us(encode, table, reps))
                times[name][1].append(_us(decode, data, reps))
        for name, (enc, dec) in times.items():
            print(
                f"| {keys:,} | {name} | {sizes[name]:,} | "
                f"{statistics.median(enc):,.1f} | {statistics.median(dec):,.1f} |"
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
