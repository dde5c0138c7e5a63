"""Recovery after ``kill -9``: time from restart to the first committed batch, 1M keys of state.

Usage: python bench/recovery.py [--keys 1000000] [--partitions 2] [--restarts 3]
       [--rate 2000] [--write-docs]

How the state is built: ``--keys`` JSON readings with distinct sites are produced to one topic
(``--partitions`` partitions) and the running-mean pipeline of ``examples/typed_processor.py``
(state per site, partition backend, local[2], Parquet sink) runs over them once with
Trigger.AvailableNow, so its checkpoint holds one state entry per site. Then, while a
producer keeps sending updates of existing sites (``--rate`` msg/s), the pipeline runs with a
2 s trigger and each cycle is: start it, wait for its first committed batch (the one Spark
replays: the kill landed inside it), let the next batch start, ``kill -9`` the driver's
process group (driver, Spark JVM, Python workers) in the middle of that batch.

Each restart is measured twice: with the worker's local state cache left as the kill left it
("warm": a restart on the same machine) and with an empty cache directory ("cold": a new
machine; the state is loaded from the checkpoint's snapshot and deltas). Reported per restart
(medians over ``--restarts``): process start to the imports done (interpreter, inorder,
PySpark), then to the SparkSession (the pipeline's checks, the JVM), then to the first
micro-batch (query start, offset log recovery, planning), the first batch itself and, inside
it, the slowest task's state load. The measured point is the
sink's commit of that batch (``run_batch`` returned; Spark's commit log follows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as common

SECTION = "## Recovery"
ROOT = common.ROOT


def child(bootstrap: str, topic: str, work: str, trigger: str, max_offsets: int) -> int:
    """The pipeline process: prints ``EVENT`` lines (wall-clock times) for the parent."""
    born = time.time()
    common.setup_env()
    sys.path.insert(0, str(ROOT))  # examples.typed_processor (the workers run in ROOT too)
    from examples.typed_processor import CODEC, RunningMean

    import inorder.pipeline.spark as spark_module
    from inorder import KafkaSource, ParquetSink, Pipeline
    from inorder.pipeline.runner import PipelineRunner

    def event(kind: str, **data: Any) -> None:
        print("EVENT " + json.dumps({"kind": kind, "t": time.time(), **data}), flush=True)

    event("born", t0=born)  # after the imports: interpreter start + inorder, pyspark, pyarrow
    build = spark_module.build_spark_session

    def timed_build(*args: Any, **kwargs: Any) -> Any:
        session = build(*args, **kwargs)
        event("spark")
        return session

    spark_module.build_spark_session = timed_build  # type: ignore[assignment]

    class Runner(PipelineRunner):
        def _make_backend(self) -> Any:
            backend = super()._make_backend()
            run_batch = backend.run_batch

            def run(df: Any, batch_id: int) -> Any:
                event("batch_start", batch=batch_id)
                report = run_batch(df, batch_id)
                loads = [p.timings.get("store_load", 0.0) for p in report.partitions]
                hits = [p.timings.get("cache_hit", 0.0) for p in report.partitions]
                event(
                    "batch_done",
                    batch=batch_id,
                    records=report.records,
                    state_keys=report.state_keys,
                    store_load=max(loads, default=0.0),
                    cache_hits=sum(hits),
                    tasks=len(report.partitions),
                )
                return report

            backend.run_batch = run
            return backend

    pipeline = Pipeline(
        source=KafkaSource(
            bootstrap_servers=bootstrap, topics=[topic], max_offsets_per_trigger=max_offsets
        ),
        processor=RunningMean(),
        codec=CODEC,
        sink=ParquetSink(f"{work}/output", compression="zstd"),
        checkpoint=f"{work}/checkpoint",
        trigger=trigger,
        name="recovery",
        spark_master="local[2]",
        progress="quiet",
    )
    summary = Runner(pipeline, handle_signals=False).run()
    event("end", records=summary.records)
    return 0


def produce_keys(bootstrap: str, topic: str, keys: int, partitions: int) -> None:
    """One reading per site ``s0000000``..: ``keys`` distinct keys of state."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 500_000}
    )
    for i in range(keys):
        site = f"s{i:07d}"
        value = b'{"site": "%s", "value": %d.0}' % (site.encode(), i % 100)
        while True:
            try:
                producer.produce(topic, key=site.encode(), value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 20_000 == 0:
            producer.poll(0)
    producer.flush(120)


class Updates:
    """Keeps sending readings of existing sites (``rate`` msg/s) until stopped."""

    def __init__(self, bootstrap: str, topic: str, keys: int, partitions: int, rate: int) -> None:
        from confluent_kafka import Producer

        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._args = (topic, keys, partitions, rate)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def _run(self) -> None:
        topic, keys, partitions, rate = self._args
        rnd = random.Random(11)
        per_tick = max(1, rate // 10)
        while not self._stop.is_set():
            for _ in range(per_tick):
                i = rnd.randrange(keys)
                site = f"s{i:07d}"
                value = b'{"site": "%s", "value": 1.0}' % site.encode()
                part = i % partitions
                self._producer.produce(topic, key=site.encode(), value=value, partition=part)
                self.sent += 1
            self._producer.poll(0)
            time.sleep(0.1)
        self._producer.flush(30)

    def __enter__(self) -> Updates:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


class Driver:
    """One pipeline child process (its own process group) and its event stream."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.spawned = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
            start_new_session=True,  # kill -9 reaches the driver, its JVM and workers
        )
        self.events: list[dict[str, Any]] = []

    def next_event(self, kind: str, timeout: float) -> dict[str, Any]:
        """Block until an event of ``kind`` (keeps all events read on the way)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if not line:
                raise SystemExit(f"pipeline exited ({self.proc.wait()}) before {kind!r}")
            if line.startswith("EVENT "):
                event = json.loads(line[6:])
                self.events.append(event)
                if event["kind"] == kind:
                    return event
        raise SystemExit(f"no {kind!r} within {timeout:g} s")

    def first(self, kind: str) -> dict[str, Any]:
        return next(e for e in self.events if e["kind"] == kind)

    def kill(self) -> None:
        """``kill -9`` of the whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def measure_restart(driver: Driver) -> dict[str, float]:
    """Wait for the first committed batch of a restarted pipeline; its timing breakdown."""
    done = driver.next_event("batch_done", 600)
    born, spark = driver.first("born"), driver.first("spark")
    start = driver.first("batch_start")
    return {
        "total": done["t"] - driver.spawned,
        "imports": born["t"] - driver.spawned,
        "to_spark": spark["t"] - born["t"],
        "to_batch": start["t"] - spark["t"],
        "batch": done["t"] - start["t"],
        "store_load": float(done["store_load"]),
        "cache_hits": float(done["cache_hits"]),
        "records": float(done["records"]),
        "state_keys": float(done["state_keys"]),
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        a = sys.argv[2:]
        return child(a[0], a[1], a[2], a[3], int(a[4]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--restarts", type=int, default=3, help="restarts per cache mode")
    parser.add_argument("--rate", type=int, default=2000, help="updates/s while running")
    parser.add_argument(
        "--max-offsets", type=int, default=250_000, help="maxOffsetsPerTrigger building state"
    )
    parser.add_argument(
        "--batch", type=int, default=20_000, help="maxOffsetsPerTrigger of the restarted runs"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    common.setup_env()
    command = "python bench/recovery.py " + " ".join(sys.argv[1:])
    results: dict[str, list[dict[str, float]]] = {"warm": [], "cold": []}
    with common.workdir("inorder-recovery-") as tmp, common.broker(tmp) as bootstrap:
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        topic = f"recovery-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions)])[topic].result(30)
        started = time.perf_counter()
        produce_keys(bootstrap, topic, args.keys, args.partitions)
        print(f"produced {args.keys:,} keys in {time.perf_counter() - started:.0f} s", flush=True)
        work = f"{tmp}/pipeline"
        base_env = dict(os.environ)

        def start(trigger: str, cache: str) -> Driver:
            env = dict(base_env)
            env["TMPDIR"] = cache  # the state cache lives under $TMPDIR
            Path(cache).mkdir(parents=True, exist_ok=True)
            cap = args.max_offsets if trigger == "available-now" else args.batch
            return Driver([bootstrap, topic, work, trigger, str(cap)], env)

        cache = f"{tmp}/cache-0"
        started = time.perf_counter()
        build = start("available-now", cache)
        build.next_event("end", 3600)
        build.proc.wait()
        built = [e for e in build.events if e["kind"] == "batch_done"]
        build_s = time.perf_counter() - started
        keys = int(built[-1]["state_keys"]) if built else 0
        print(f"state built: {keys:,} keys in {build_s:.0f} s ({len(built)} batches)", flush=True)
        with Updates(bootstrap, topic, args.keys, args.partitions, args.rate):
            driver = start("2 seconds", cache)
            driver.next_event("batch_done", 600)
            for cycle in range(2 * args.restarts):
                # Kill inside a batch: wait for one to start, then land the kill in it.
                driver.next_event("batch_start", 120)
                time.sleep(0.2 + 0.4 * random.random())
                driver.kill()
                mode = "warm" if cycle % 2 == 0 else "cold"
                if mode == "cold":
                    cache = f"{tmp}/cache-{cycle + 1}"  # warm: the cache the killed run used
                driver = start("2 seconds", cache)
                result = measure_restart(driver)
                results[mode].append(result)
                print(
                    f"restart {cycle + 1} ({mode}): {result['total']:.1f} s to the first commit "
                    f"(imports {result['imports']:.1f} s, SparkSession {result['to_spark']:.1f} s, "
                    "query start + planning "
                    f"{result['to_batch']:.1f} s, batch {result['batch']:.1f} s of which state "
                    f"load {result['store_load']:.1f} s; {result['records']:.0f} records, "
                    f"{result['state_keys']:,.0f} keys)",
                    flush=True,
                )
            driver.next_event("batch_start", 120)
            driver.kill()
    rows = []
    for mode in ("warm", "cold"):
        runs = results[mode]
        if not runs:
            continue

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return common.median([r[key] for r in runs])

        rows.append(
            [
                mode,
                len(runs),
                f"{med('total'):.1f}",
                f"{med('imports'):.1f}",
                f"{med('to_spark'):.1f}",
                f"{med('to_batch'):.1f}",
                f"{med('batch'):.1f}",
                f"{med('store_load'):.1f}",
                ", ".join(f"{r['total']:.1f}" for r in runs),
            ]
        )
    worst = max(r["total"] for runs in results.values() for r in runs)
    text = (
        f"{SECTION}\n\n{common.header(command)}\n\n"
        f"State: {keys:,} keys (one per site) of the running-mean pipeline "
        "(`examples/typed_processor.py`, partition backend, local[2], Parquet sink), built by "
        f"reading {args.keys:,} distinct-key readings from {args.partitions} partitions "
        f"({build_s:.0f} s). Then, with {args.rate:,} updates/s being produced, a 2 s "
        f"trigger and `maxOffsetsPerTrigger` {args.batch:,}, the driver's process group "
        "(driver, Spark JVM, Python workers) is killed with SIGKILL inside a batch and "
        "restarted; measured: from the restart to the sink's commit of the first batch (the "
        "replay of the killed one). Warm: the worker's local state cache as the kill left it "
        "(same machine); cold: an empty cache directory (the state is loaded from the "
        "checkpoint: snapshot + deltas). Medians:\n\n"
        + common.table(
            [
                "cache",
                "restarts",
                "restart to first commit s",
                "interpreter + imports s",
                "checks + SparkSession s",
                "query start + planning s",
                "first batch s",
                "of which state load s",
                "runs s",
            ],
            rows,
            right=(1, 2, 3, 4, 5, 6, 7),
        )
        + f"\n\nTarget < 30 s: **{'met' if worst < 30 else 'missed'}** (worst restart "
        f"{worst:.1f} s).\n"
    )
    print(text)
    if args.write_docs:
        common.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
