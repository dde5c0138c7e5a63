"""End to end: simulator -> broker -> session-table pipeline -> Parquet, against baselines.

Usage: python bench/e2e_throughput.py [--messages N] [--max-offsets M] [--runs R]
       [--vanilla-runs V] [--write-docs] [--inorder-only]

``--inorder-only`` runs just the inorder pipeline and prints each run's rates and engine
timings as JSON (for profiling, e.g. under ``py-spy record --subprocesses``).

One backlog of simulated session traffic (3 sites x 4 partitions, no faults) is produced once;
then, in the same process and the same run, each contender reads all of it from the start:

* raw: one confluent-kafka consumer reading every partition (the ceiling);
* inorder: the ``examples/sessions.toml`` pipeline (local[2], Trigger.AvailableNow,
  ``maxOffsetsPerTrigger`` so there are several batches, Parquet sink);
* vanilla: the same source + ``groupBy(session).applyInPandasWithState`` + Spark's Parquet
  writer in foreachBatch (``bench/vanilla_sessions.py``);
* pure Python: one process, confluent-kafka consumer, dict state, the same processor, a
  pyarrow Parquet writer.

"whole run" is messages / wall time of the query (Spark session already up; includes the
first batch and Python worker start-up); "steady" is records / ``triggerExecution``
of the data batches after the first data batch. Medians of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

SECTION = "## End to end"


def topic_partitions(bootstrap: str, prefix: str) -> list[tuple[str, int]]:
    """Every (topic, partition) of the simulation's topics."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return sorted(
        (t, p) for t, tm in meta.topics.items() if t.startswith(prefix) for p in tm.partitions
    )


def _consumer(bootstrap: str, tps: list[tuple[str, int]]) -> Any:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "receive.message.max.bytes": 2147483647,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(t, p, 0) for t, p in tps])
    return consumer


def raw_rate(bootstrap: str, tps: list[tuple[str, int]], total: int) -> float:
    """Messages/s of one consumer reading everything (values touched, nothing else)."""
    consumer = _consumer(bootstrap, tps)
    started = time.perf_counter()
    seen = 0
    while seen < total:
        for message in consumer.consume(num_messages=10_000, timeout=1.0):
            if message.error() is None:
                message.value()
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return seen / elapsed


def pure_python_rate(bootstrap: str, tps: list[tuple[str, int]], total: int, out: str) -> float:
    """Messages/s of one process: consume, decode, apply with dict state, write Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from _session_rows import SessionContext, change_schema

    from inorder.codecs.base import DecodeError
    from inorder.processor import Violation
    from inorder.sessions.messages import SessionCodec
    from inorder.sessions.processor import SessionState, SessionTables

    processor = SessionTables(row_key="id")
    codec = SessionCodec("id")
    states: dict[str, SessionState] = {}
    ctx = SessionContext()
    schema = change_schema()
    from datetime import UTC, datetime

    cols: list[list[Any]] = [[] for _ in schema]
    writer = pq.ParquetWriter(
        f"{out}/pure-{uuid.uuid4().hex[:8]}.parquet", schema, compression="zstd"
    )

    def flush() -> None:
        writer.write_batch(
            pa.RecordBatch.from_arrays(
                [pa.array(c, t.type) for c, t in zip(cols, schema, strict=True)], schema=schema
            )
        )
        for c in cols:
            c.clear()

    consumer = _consumer(bootstrap, tps)
    started = time.perf_counter()
    seen = 0
    while seen < total:
        for m in consumer.consume(num_messages=10_000, timeout=1.0):
            if m.error() is not None:
                continue
            seen += 1
            ctx.timestamp = datetime.fromtimestamp(m.timestamp()[1] / 1000, UTC)
            try:
                msg = codec.decode(m.value(), None)
                state = states.get(msg.session) or SessionState()
                changes = list(processor.process(state, msg, ctx))
                states[msg.session] = state
            except (Violation, DecodeError):
                session = (m.key() or b"").decode()
                states.pop(session, None)
                changes = list(processor.on_reset(session, Violation("x", "x"), ctx))  # type: ignore[arg-type]
            for c in changes:
                cols[0].append(m.topic())
                cols[1].append(m.partition())
                cols[2].append(m.offset())
                cols[3].append(c.kafka_ts)
                cols[4].append(c.session)
                cols[5].append(c.seq)
                cols[6].append(c.op)
                cols[7].append(c.row_id)
                cols[8].append(c.row)
        if len(cols[0]) >= 100_000:
            flush()
    flush()
    writer.close()
    elapsed = time.perf_counter() - started
    consumer.close()
    return seen / elapsed


def _steady(progress: list[dict[str, Any]]) -> float:
    data = [p for p in progress if int(p.get("numInputRows", 0)) > 0]
    steady = data[1:] or data
    rows = sum(int(p["numInputRows"]) for p in steady)
    busy = sum(float(p["durationMs"]["triggerExecution"]) for p in steady) / 1000.0
    return rows / busy if busy > 0 else 0.0


def inorder_run(
    bootstrap: str, prefix: str, tmp: str, total: int, max_offsets: int, master: str = "local[2]"
) -> dict[str, Any]:
    """One run of the inorder pipeline from a fresh checkpoint: rates and batch details."""
    from inorder.assemble import build_pipeline
    from inorder.pipeline.runner import PipelineRunner

    work = f"{tmp}/inorder-{uuid.uuid4().hex[:8]}"
    pipeline = build_pipeline(
        common.sessions_config(bootstrap, prefix, work, max_offsets=max_offsets, master=master)
    )
    runner = PipelineRunner(pipeline, handle_signals=False)
    progress: dict[int, dict[str, Any]] = {}
    reports: dict[int, Any] = {}
    make_backend = runner._make_backend

    def capturing_backend() -> Any:
        # The runner drops a batch's report once printed: keep our own copy.
        backend = make_backend()
        run_batch = backend.run_batch

        def run(df: Any, batch_id: int) -> Any:
            report = run_batch(df, batch_id)
            reports[batch_id] = report
            return report

        backend.run_batch = run
        return backend

    runner._make_backend = capturing_backend  # type: ignore[method-assign]
    report = runner._report_progress

    def capture(query: Any, printed: set[int], summary: Any) -> None:
        for p in query.recentProgress:
            d = json.loads(p.json) if hasattr(p, "json") else dict(p)
            progress[int(d["batchId"])] = d
        report(query, printed, summary)

    runner._report_progress = capture  # type: ignore[method-assign]
    started = time.perf_counter()
    summary = runner.run()
    wall = time.perf_counter() - started
    records = sum(int(r.records) for r in reports.values())
    assert records == total, f"inorder read {records} records, expected {total}"
    timings: dict[str, float] = {}
    for rep in reports.values():
        for part in rep.partitions:
            for k, v in part.timings.items():
                if k not in ("cache_hit", "cache_reused", "cache_opened", "caught_up"):
                    timings[k] = timings.get(k, 0.0) + v
    batches = [progress[b] for b in sorted(progress)]
    # Where the trigger time goes (Spark's phases, summed over the data batches after the
    # first): planning and offset-log work vs the foreachBatch body (addBatch).
    phases: dict[str, float] = {}
    for p in batches[1:]:
        for k, v in p["durationMs"].items():
            phases[k] = phases.get(k, 0.0) + float(v) / 1000.0
    return {
        "whole": total / wall,
        "steady": _steady(batches),
        "batches": len(batches),
        "first_batch_s": float(batches[0]["durationMs"]["triggerExecution"]) / 1000
        if batches
        else 0,
        "output_rows": summary.output_rows,
        "task_seconds": timings,
        "spark_phase_seconds": phases,
    }


def vanilla_run(
    spark: Any, bootstrap: str, prefix: str, tmp: str, total: int, max_offsets: int
) -> dict[str, Any]:
    """One run of the vanilla PySpark pipeline from a fresh checkpoint."""
    from vanilla_sessions import progress_of, start_vanilla

    work = f"{tmp}/vanilla-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    query = start_vanilla(
        spark,
        bootstrap,
        f"{prefix}.*",
        f"{work}/output",
        f"{work}/checkpoint",
        max_offsets=max_offsets,
    )
    query.awaitTermination()
    wall = time.perf_counter() - started
    progress = progress_of(query)
    rows = sum(int(p["numInputRows"]) for p in progress)
    assert rows == total, f"vanilla read {rows} records, expected {total}"
    return {"whole": total / wall, "steady": _steady(progress), "batches": len(progress)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--max-offsets", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vanilla-runs", type=int, default=1)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--inorder-only",
        action="store_true",
        help="run only the inorder pipeline (for profiling); prints its rates, no table",
    )
    args = parser.parse_args()
    common.setup_env()
    from inorder.pipeline.spark import build_spark_session

    command = "python bench/e2e_throughput.py " + " ".join(sys.argv[1:])
    with common.workdir("inorder-e2e-") as tmp, common.broker(tmp) as bootstrap:
        prefix = f"e2e-{uuid.uuid4().hex[:6]}-"
        t0 = time.perf_counter()
        sim = common.simulate_backlog(bootstrap, prefix, args.messages)
        total = int(sim.records)
        print(f"produced {total:,} messages in {time.perf_counter() - t0:.1f} s", flush=True)
        tps = topic_partitions(bootstrap, prefix)
        spark = build_spark_session("local[2]", "bench", local_dir=tmp)
        res: dict[str, list[Any]] = {"raw": [], "inorder": [], "vanilla": [], "pure": []}
        loads: list[float] = []
        runs_text: list[str] = []
        if args.inorder_only:
            for _ in range(args.runs):
                r = inorder_run(bootstrap, prefix, tmp, total, args.max_offsets)
                print(json.dumps(r), flush=True)
            spark.stop()
            return 0
        for run in range(args.runs):
            res["raw"].append(raw_rate(bootstrap, tps, total))
            res["inorder"].append(inorder_run(bootstrap, prefix, tmp, total, args.max_offsets))
            out = f"{tmp}/pure-{run}"
            Path(out).mkdir()
            res["pure"].append(pure_python_rate(bootstrap, tps, total, out))
            if run < args.vanilla_runs:
                res["vanilla"].append(
                    vanilla_run(spark, bootstrap, prefix, tmp, total, args.max_offsets)
                )
            i = res["inorder"][-1]
            v = res["vanilla"][-1] if run < args.vanilla_runs else None
            loads.append(os.getloadavg()[0])
            runs_text.append(
                f"run {run + 1} (load {loads[-1]:.1f}): raw {res['raw'][-1]:,.0f}, inorder "
                f"{i['whole']:,.0f} / {i['steady']:,.0f} steady"
                + (f", vanilla {v['whole']:,.0f} / {v['steady']:,.0f} steady" if v else "")
                + f", pure Python {res['pure'][-1]:,.0f}"
            )
            print(
                f"run {run + 1}: raw {res['raw'][-1]:,.0f}/s  inorder {i['whole']:,.0f}/s "
                f"(steady {i['steady']:,.0f}/s, {i['batches']} batches, "
                f"first {i['first_batch_s']:.1f} s)  "
                f"pure-python {res['pure'][-1]:,.0f}/s"
                + (f"  vanilla {v['whole']:,.0f}/s (steady {v['steady']:,.0f}/s)" if v else ""),
                flush=True,
            )
        spark.stop()
    med = common.median
    raw = med(res["raw"])
    ino_w = med([r["whole"] for r in res["inorder"]])
    ino_s = med([r["steady"] for r in res["inorder"]])
    van_w = med([r["whole"] for r in res["vanilla"]])
    van_s = med([r["steady"] for r in res["vanilla"]])
    pure = med(res["pure"])
    secs: dict[str, float] = {}
    for r in res["inorder"]:
        for k, v in r["task_seconds"].items():
            secs[k] = secs.get(k, 0.0) + v / len(res["inorder"])
    rows = [
        ["raw confluent-kafka consume (ceiling)", f"{raw:,.0f}", "-", "100%", "-", len(res["raw"])],
        [
            "inorder pipeline",
            f"{ino_w:,.0f}",
            f"{ino_s:,.0f}",
            f"{ino_w / raw:.0%} (steady {ino_s / raw:.0%})",
            "1.0x",
            len(res["inorder"]),
        ],
        [
            "vanilla PySpark (applyInPandasWithState)",
            f"{van_w:,.0f}",
            f"{van_s:,.0f}",
            f"{van_w / raw:.0%}",
            f"{ino_w / van_w:.1f}x (steady {ino_s / van_s:.1f}x)" if van_w else "-",
            len(res["vanilla"]),
        ],
        [
            "pure Python, 1 process (dict state, pyarrow writer)",
            f"{pure:,.0f}",
            "-",
            f"{pure / raw:.0%}",
            f"{ino_w / pure:.2f}x",
            len(res["pure"]),
        ],
    ]
    text = (
        f"{SECTION}\n\n{common.header(command)}\n\n"
        f"Backlog: {total:,} simulated session messages (3 topics x 4 partitions, 120 sessions), "
        f"`maxOffsetsPerTrigger` {args.max_offsets:,}, Spark local[2], Trigger.AvailableNow. "
        "Whole run: messages / wall time of the query (Spark session already up; includes the "
        "first batch and Python worker start-up). Steady: records / trigger time of the "
        'data batches after the first one. Medians of the runs. "vs" is inorder\'s rate over '
        "the contender's. Both Spark pipelines run in the same session, so the vanilla one "
        "also gets inorder's Python worker daemon (PySpark preloaded in workers).\n\n"
        + common.table(
            ["contender", "whole run msg/s", "steady msg/s", "of raw", "inorder vs", "runs"],
            rows,
            right=(1, 2, 3, 4, 5),
        )
        + "\n\nTargets: inorder >= 60% of raw (whole run: "
        f"**{ino_w / raw:.0%}**, steady: **{ino_s / raw:.0%}**), >= 5x vanilla ("
        + (
            f"**{ino_w / van_w:.1f}x** whole run, {ino_s / van_s:.1f}x steady)."
            if van_w and van_s
            else "not run)."
        )
    )
    text += (
        "\n\nPer run (msg/s, whole / steady; 1-minute load average after the run): "
        + "; ".join(runs_text)
        + ".\n\nEngine seconds per run, summed over the 12 topic-partitions (2 cores): "
        + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(secs.items()))
        + ".\n"
    )
    print(text)
    if args.write_docs:
        common.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
