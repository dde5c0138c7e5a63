"""Sink throughput: ParquetSink and DeltaSink vs ``pyarrow.dataset.write_dataset``.

Writes the same in-memory data (session-table-like rows, partitioned by topic, zstd) with
each writer, on local disk and on S3 (a SeaweedFS started for the run, or
``$INORDER_S3_ENDPOINT`` + ``AWS_*``), several repetitions, and reports median rows/s, MB/s
(uncompressed Arrow bytes) and the ratio to ``write_dataset`` measured in the same run.
The sinks are timed end to end: staging writes plus the commit.

    .venv/bin/python bench/sink_throughput.py --rows 2000000 --repeat 3 --append-docs
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from inorder.sinks.delta import DeltaSink
from inorder.sinks.parquet import ParquetSink

ROOT = Path(__file__).resolve().parent.parent
TASKS = 2  # the batch is staged by this many writers, as by Spark tasks


def make_data(rows: int) -> pa.Table:
    """Output rows shaped like the session-table processor's, 4 topics."""
    import numpy as np

    rng = np.random.default_rng(7)
    ids = np.arange(rows)
    return pa.table(
        {
            "topic": pa.array(np.array(["site-a", "site-b", "site-c", "site-d"])[ids % 4]),
            "partition": pa.array((ids % 8).astype(np.int32)),
            "offset": pa.array(ids, pa.int64()),
            "kafka_ts": pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us", tz="UTC")),
            "session": pa.array([f"session-{i % 500}" for i in range(rows)]),
            "seq": pa.array(ids // 500, pa.int64()),
            "op": pa.array(np.array(["insert", "update", "delete"])[ids % 3]),
            "row_id": pa.array([f"r{i % 10000}" for i in range(rows)]),
            "row": pa.array(
                [f'{{"id":"r{i % 10000}","v":{v:.4f}}}' for i, v in enumerate(rng.random(rows))]
            ),
            "batch_id": pa.array(np.zeros(rows, dtype=np.int64)),
        }
    )


def run_write_dataset(table: pa.Table, target: str, fs: Any) -> None:
    ds.write_dataset(
        table,
        target,
        filesystem=fs,
        format="parquet",
        partitioning=["topic"],
        partitioning_flavor="hive",
        file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
        existing_data_behavior="overwrite_or_ignore",
        max_rows_per_group=1 << 20,
        min_rows_per_group=1 << 16,
    )


def run_sink(sink: Any, table: pa.Table) -> None:
    files = []
    per = (table.num_rows + TASKS - 1) // TASKS
    for t in range(TASKS):
        writer = sink.open_writer(table.schema, 0, f"task{t}")
        for batch in table.slice(t * per, per).to_batches(max_chunksize=65536):
            writer.write(batch)
        files += writer.close()
    assert sink.commit(0, files)


def make_and_run(kind: str, path: str, options: dict[str, str] | None, table: pa.Table) -> None:
    """Create the sink (its check() included in the timing) and write one batch."""
    sink: Any
    if kind == "delta":
        sink = DeltaSink(path, partition_by=["topic"], storage_options=options)
    else:
        sink = ParquetSink(path, partition_by=["topic"], storage_options=options)
    sink.check(table.schema)
    run_sink(sink, table)


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(
    where: str, table: pa.Table, repeat: int, s3: dict[str, str] | None
) -> list[dict[str, Any]]:
    results: dict[str, list[float]] = {"write_dataset": [], "ParquetSink": [], "DeltaSink": []}
    tmp = tempfile.mkdtemp(prefix="sink-bench-")
    try:
        for _ in range(repeat):
            run_id = uuid.uuid4().hex[:8]
            if s3 is None:
                base = f"{tmp}/{run_id}"
                from pyarrow.fs import LocalFileSystem

                wd_fs: Any = LocalFileSystem()
                wd_target = f"{base}/wd"
                options = None
            else:
                from inorder.storage.fs import S3Settings

                base = f"s3://{s3['bucket']}/bench/{run_id}"
                options = {k: v for k, v in s3.items() if k != "bucket"}
                wd_fs = S3Settings.from_options(options).pyarrow_fs()
                wd_target = f"{s3['bucket']}/bench/{run_id}/wd"
            results["write_dataset"].append(
                timed(functools.partial(run_write_dataset, table, wd_target, wd_fs))
            )
            results["ParquetSink"].append(
                timed(functools.partial(make_and_run, "parquet", f"{base}/pq", options, table))
            )
            results["DeltaSink"].append(
                timed(functools.partial(make_and_run, "delta", f"{base}/delta", options, table))
            )
            if s3 is None:
                shutil.rmtree(base, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mb = table.nbytes / 1e6
    base_median = statistics.median(results["write_dataset"])
    rows_out = []
    for name, times in results.items():
        med = statistics.median(times)
        rows_out.append(
            {
                "where": where,
                "writer": name,
                "seconds": med,
                "rows_per_s": table.num_rows / med,
                "mb_per_s": mb / med,
                "ratio": base_median / med,
            }
        )
    return rows_out


def start_s3(state_dir: Path) -> dict[str, str]:
    """S3 settings: ``$INORDER_S3_ENDPOINT`` if set, else a SeaweedFS started here."""
    from inorder.dev import services
    from inorder.endpoints import ENV_S3_ENDPOINT, s3_settings

    if not os.environ.get(ENV_S3_ENDPOINT, "").strip():
        services.up(state_dir, s3_port=0, only=["s3"], credentials=services.generate_credentials())
    settings = s3_settings(None if os.environ.get(ENV_S3_ENDPOINT) else state_dir)
    return {
        "endpoint_url": settings.endpoint_url,
        "access_key_id": settings.access_key_id,
        "secret_access_key": settings.secret_access_key,
        "region": settings.region,
        "bucket": settings.bucket,
    }


def markdown(rows: int, repeat: int, results: list[dict[str, Any]]) -> str:
    lines = [
        "## Sinks",
        "",
        f"`bench/sink_throughput.py --rows {rows} --repeat {repeat}` on "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; one batch of {rows:,} rows "
        "(10 columns, session-table shaped, 4 topic partitions, zstd), staged by "
        f"{TASKS} writers then committed; medians of {repeat} runs. MB/s counts uncompressed "
        "Arrow bytes. S3 is a local SeaweedFS. Ratio = write_dataset time / writer time.",
        "",
        "| where | writer | median s | rows/s | MB/s | vs write_dataset |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['where']} | {r['writer']} | {r['seconds']:.2f} | {r['rows_per_s']:,.0f} | "
            f"{r['mb_per_s']:.1f} | {r['ratio'] * 100:.0f}% |"
        )
    return "\n".join(lines) + "\n"


def append_docs(text: str) -> None:
    """Replace (or add) the ``## Sinks`` section of docs/benchmarks.md."""
    path = ROOT / "docs" / "benchmarks.md"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    start = old.find("## Sinks\n")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        old = old[:start] + (old[end + 1 :] if end >= 0 else "")
    path.write_text(old.rstrip("\n") + "\n\n" + text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--append-docs", action="store_true")
    args = parser.parse_args()
    table = make_data(args.rows)
    results = bench("local", table, args.repeat, None)
    state_dir = Path(tempfile.mkdtemp(prefix="sink-bench-s3-"))
    try:
        if not args.no_s3:
            results += bench("s3", table, args.repeat, start_s3(state_dir))
    finally:
        if not args.no_s3 and not os.environ.get("INORDER_S3_ENDPOINT"):
            from inorder.dev import services

            services.down(state_dir, only=["s3"])
        shutil.rmtree(state_dir, ignore_errors=True)
    text = markdown(args.rows, args.repeat, results)
    print(text)
    if args.append_docs:
        append_docs(text)


if __name__ == "__main__":
    main()
