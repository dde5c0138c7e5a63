"""Helpers shared by the benchmark scripts: a broker, a backlog, the pipeline, docs sections."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"


def setup_env() -> None:
    """Python workers must run this interpreter (see docs/engine.md)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@contextlib.contextmanager
def broker(tmp: str) -> Iterator[str]:
    """Bootstrap servers: ``$INORDER_KAFKA_BOOTSTRAP_SERVERS`` or a throwaway local noida-db."""
    bootstrap = os.environ.get("INORDER_KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if bootstrap:
        yield bootstrap
        return
    from inorder.dev import services
    from inorder.endpoints import kafka_bootstrap_servers

    state_dir = Path(tmp) / "kafka"
    state_dir.mkdir(parents=True, exist_ok=True)
    services.up(state_dir, kafka_port=0, only=["kafka"])
    try:
        yield kafka_bootstrap_servers(state_dir)
    finally:
        services.down(state_dir, only=["kafka"])


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[str]:
    """A temporary directory removed at the end (``$INORDER_BENCH_KEEP=1`` keeps it)."""
    if os.environ.get("INORDER_BENCH_KEEP"):
        yield tempfile.mkdtemp(prefix=prefix)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield tmp


def simulate_backlog(
    bootstrap: str,
    prefix: str,
    messages: int,
    sites: int = 3,
    partitions: int = 4,
    sessions_per_site: int = 40,
    rate: float = 0.0,
    duration: float | None = None,
) -> Any:
    """Produce session traffic (the demo's shape, no faults); the simulation result."""
    from inorder.dev.sim_model import SimulationConfig
    from inorder.dev.simulator import simulate

    config = SimulationConfig(
        sites=sites,
        topic_prefix=prefix,
        partitions=partitions,
        sessions_per_site=sessions_per_site,
        rows_per_snapshot=20,
        messages=messages if duration is None else None,
        duration=duration,
        rate=rate,
        restart_every=500,
        faulty_sessions=0.0,
        seed=7,
    )
    return simulate(config, bootstrap)


def sessions_config(
    bootstrap: str,
    prefix: str,
    work: str,
    *,
    max_offsets: int | None,
    trigger: str = "available-now",
    master: str = "local[2]",
    name: str = "bench",
    spark_conf: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The session-table pipeline of ``examples/sessions.toml`` over one simulation's topics."""
    from inorder.pipeline.config import validate

    source: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "topic_pattern": f"{prefix}.*",
        "starting_offsets": "earliest",
        "topic_discovery_interval": "5 seconds",
    }
    if max_offsets is not None:
        source["max_offsets_per_trigger"] = max_offsets
    return validate(
        {
            "pipeline": {
                "name": name,
                "checkpoint": f"{work}/checkpoint",
                "trigger": trigger,
                "progress": "quiet",
            },
            "source": source,
            "processor": {"type": "sessions", "options": {"row_key": "id"}},
            "integrity": {"tier": "strict", "on_violation": "restart_session"},
            "sink": {
                "type": "parquet",
                "path": f"{work}/output",
                "partition_by": ["topic"],
                "compression": "zstd",
            },
            "spark": {"master": master, "conf": dict(spark_conf or {})},
        }
    )


def sessions_run_args(bootstrap: str, prefix: str, max_offsets: int, work: str) -> list[str]:
    """``inorder run`` arguments for the session job of ``examples/sessions.toml`` over the
    topics ``prefix*``: local[2], AvailableNow, JSON progress, checkpoint and output in
    ``work``."""
    return [
        "run",
        str(ROOT / "examples" / "sessions.toml"),
        "--progress",
        "json",
        "--trigger",
        "available-now",
        "--master",
        "local[2]",
        "--set",
        f"source.bootstrap_servers={bootstrap}",
        "--set",
        f"source.topic_pattern={prefix}.*",
        "--set",
        f"source.max_offsets_per_trigger={max_offsets}",
        "--set",
        f"pipeline.checkpoint={work}/checkpoint",
        "--set",
        f"sink.path={work}/output",
    ]


def median(values: Sequence[float]) -> float:
    """The median (0 for no values)."""
    return statistics.median(values) if values else 0.0


def versions() -> str:
    """Python, PySpark, pyarrow, confluent-kafka versions (one line)."""
    import confluent_kafka
    import pyarrow

    try:
        import pyspark

        spark = pyspark.__version__
    except ImportError:
        spark = "-"
    return (
        f"Python {platform.python_version()}, PySpark {spark}, pyarrow {pyarrow.__version__}, "
        f"confluent-kafka {confluent_kafka.version()[0]}"
    )


def machine() -> str:
    """Cores, memory and the current 1-minute load average (one line)."""
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    return (
        f"{os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )


def header(command: str) -> str:
    """The paragraph every section starts with: date, command, machine, versions."""
    return (
        f"`{command}` on {time.strftime('%Y-%m-%d %H:%M')}; {machine()} (at the end of the run); "
        f"{versions()}; local noida-db broker."
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """A Markdown table (columns in ``right`` right-aligned)."""
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(section: str, text: str) -> None:
    """Replace (or append) ``section`` (a ``## ...`` heading) of docs/benchmarks.md."""
    current = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    start = current.find(section + "\n")
    if start >= 0:
        nxt = current.find("\n## ", start + len(section))
        current = current[:start] + current[nxt + 1 if nxt >= 0 else len(current) :]
    DOCS.write_text(current.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
