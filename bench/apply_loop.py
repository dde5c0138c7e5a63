"""The ordered-apply loop alone: CPU seconds per record of ``OrderedApplier``, no Spark.

Run: ``.venv/bin/python bench/apply_loop.py [--records N] [--runs R] [--vs CHECKOUT]``

One topic-partition, 10k keys, the same per-key work as ``bench/engine_throughput.py`` (count
and sum, no output rows), records as the partition backend hands them to the applier. Three
shapes of the loop are measured, each after a warm-up pass:

* ``strict``: ``Integrity.strict()`` (policy ``fail``), record timestamps as event time;
* ``sequence``: ``Integrity.strict(sequence_field=...)``: the sequence check on every record;
* ``none``: ``Integrity.none()`` (policy ``dead_letter``: the state is copied before each
  call so a rejected call can leave it as it was, with the state codec as the engine's tasks
  do);
* ``external``: ``strict`` with records carrying their partition's watermark (the Spark
  backend's form).

With ``--vs CHECKOUT`` (another source tree, e.g. a ``git worktree`` of an older commit) the
runs alternate between that tree and this one, each in its own interpreter, and the medians
of both are printed side by side: the way to check a change to the loop keeps its speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEYS = 10_000
SHAPES = ("strict", "sequence", "none", "external")


@dataclass
class Acc:
    """Per-key state."""

    count: int = 0
    total: int = 0


def _records(n: int, shape: str) -> list[tuple[Any, ...]]:
    keys = [f"k{i}".encode() for i in range(KEYS)]
    base_us = 1_700_000_000_000_000
    out: list[tuple[Any, ...]] = []
    for offset in range(n):
        key = keys[(offset * 7919) % KEYS]
        seq = offset // KEYS + 1
        value = (offset % 97).to_bytes(8, "little") + seq.to_bytes(8, "little")
        rec: tuple[Any, ...] = (offset, key, value, base_us + offset, None)
        if shape == "external":
            rec = (*rec, base_us + offset - 1_000_000)
        out.append(rec)
    return out


def measure(n: int, runs: int) -> dict[str, list[float]]:
    """CPU seconds per record of each shape, ``runs`` times after one warm-up."""
    from inorder.engine.apply import OrderedApplier
    from inorder.integrity import Integrity
    from inorder.processor import Context, Processor
    from inorder.state.entry import KeyEntry, PartitionMeta

    @dataclass
    class Msg:
        key: str
        value: int
        seq: int

    @dataclass
    class Out:
        k: str
        count: int

    class Codec:
        def decode(self, value: bytes | None, key: bytes | None) -> Msg:
            raw = value or b""
            return Msg(
                (key or b"").decode(),
                int.from_bytes(raw[:8], "little"),
                int.from_bytes(raw[8:], "little"),
            )

    class CountSum(Processor[Msg, Acc, Out]):
        def key(self, msg: Msg) -> str:
            return msg.key

        def initial_state(self, key: str) -> Acc:
            return Acc()

        def process(self, state: Acc, msg: Msg, ctx: Context) -> list[Out]:
            state.count += 1
            state.total += msg.value
            return []

    class View:
        def load(self, key: str) -> KeyEntry | None:
            return None

        def timers_after(self, kind: int, after: Any, limit: int) -> list[tuple[int, str]]:
            return []

    integrity = {
        "strict": Integrity.strict(),
        "sequence": Integrity.strict(sequence_field="seq"),
        "none": Integrity.none(),
        "external": Integrity.strict(),
    }
    # The engine's tasks copy state with the state codec (a tree without StateCodec.copy
    # copies with copy.deepcopy, the applier's default).
    try:
        from inorder.state.codec import StateCodec

        copier: Any = getattr(StateCodec(Acc), "copy", None)
    except ImportError:
        copier = None
    copy_kwargs = {} if copier is None else {"copy_state": copier}
    results: dict[str, list[float]] = {}
    for shape in SHAPES:
        records = _records(n, shape)
        times: list[float] = []
        for run in range(runs + 1):
            applier = OrderedApplier(
                CountSum(),
                Codec(),
                integrity[shape],
                View(),
                "bench",
                0,
                run,
                datetime(2026, 1, 1, tzinfo=UTC),
                PartitionMeta(),
                external_watermark=shape == "external",
                **copy_kwargs,
            )
            started = time.process_time()
            applier.apply(records)  # type: ignore[arg-type]
            applier.finish()
            spent = time.process_time() - started
            assert applier.failed is None, applier.failed
            assert applier.counters["records"] == n
            if run:
                times.append(spent / n)
        results[shape] = times
    return results


def _run_in(tree: Path, n: int, runs: int) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--records",
            str(n),
            "--runs",
            str(runs),
            "--json",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=str(tree),
    ).stdout
    result: dict[str, list[float]] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    """Print the median CPU microseconds per record of each loop shape."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--vs", type=Path, help="another source tree to alternate with")
    parser.add_argument("--rounds", type=int, default=5, help="alternations with --vs")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(args.records, args.runs)))
        return
    if args.vs is None:
        for shape, times in measure(args.records, args.runs).items():
            print(f"{shape:9} {statistics.median(times) * 1e6:7.3f} µs CPU/record")
        return
    trees = {"other": args.vs.resolve(), "this": ROOT}
    samples: dict[str, dict[str, list[float]]] = {t: {s: [] for s in SHAPES} for t in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            for shape, times in _run_in(tree, args.records, args.runs).items():
                samples[name][shape].append(statistics.median(times))
    print(f"load average {os.getloadavg()[0]:.2f}; medians of {args.rounds} alternating rounds")
    for shape in SHAPES:
        other = statistics.median(samples["other"][shape]) * 1e6
        this = statistics.median(samples["this"][shape]) * 1e6
        print(
            f"{shape:9} other {other:7.3f}  this {this:7.3f} µs CPU/record  "
            f"this/other {this / other:.3f}"
        )


if __name__ == "__main__":
    main()
