"""The main job end to end: local broker -> simulated sites -> session tables -> Parquet.

Each run works in its own subdirectory and topic prefix, so repeated demos never mix data.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from inorder.errors import InorderError

#: The session pipeline the demo runs (shipped in the package; examples/sessions.toml links to it).
EXAMPLE_PIPELINE = Path(__file__).parent / "dev" / "sessions.toml"


@dataclass
class DemoSettings:
    """What the demo runs."""

    base_dir: Path = Path(".inorder/demo")
    state_dir: Path | None = None
    sites: int = 3
    sessions_per_site: int = 40
    messages: int = 60000
    faulty_sessions: float = 0.1
    master: str = "local[2]"
    keep_running: bool = False


def query_command(output: Path) -> str:
    """A shell command printing the output's rows per topic and op with DuckDB (the Python
    package, a dependency: no DuckDB command line tool is installed)."""
    sql = (
        f"select topic, op, count(*) as rows from read_parquet('{output}/*/*.parquet', "
        "hive_partitioning = true) group by all order by all"
    )
    python = shlex.quote(sys.executable)
    script = 'import duckdb; duckdb.sql("' + sql + '").show()'
    if any(c in str(output) for c in "'\"$`\\!"):
        return f"{python} -c {shlex.quote(script)}"
    # The readable form: nothing in the path means anything inside double quotes.
    return python + ' -c "' + script.replace('"', '\\"') + '"'


def _say(text: str) -> None:
    print(text, flush=True)


def _ensure_broker(state_dir: Path) -> tuple[str, bool]:
    """Bootstrap servers of a running broker (env, dev services, or one started now)."""
    from inorder.dev import services
    from inorder.endpoints import ENV_KAFKA, kafka_bootstrap_servers

    if os.environ.get(ENV_KAFKA, "").strip():
        return kafka_bootstrap_servers(), False
    try:
        reports = services.up(state_dir, only=["kafka"])
    except InorderError as exc:
        if "in use" not in str(exc) and "taken" not in str(exc):
            raise
        reports = services.up(state_dir, only=["kafka"], kafka_port=0)
    started = any(r.state == "started" for r in reports)
    return kafka_bootstrap_servers(state_dir), started


def run_demo(settings: DemoSettings) -> bool:
    """Run the demo, print its summary; True when the output matches the ground truth."""
    from inorder.assemble import build_pipeline
    from inorder.dev import services
    from inorder.dev.sim_config import FaultRates, SimulationConfig
    from inorder.dev.simulator import simulate
    from inorder.dev.verify import verify_tables
    from inorder.endpoints import resolve_state_dir
    from inorder.pipeline.config import load_toml
    from inorder.sessions.rebuild import read_changes, rebuild_tables

    state_dir = resolve_state_dir(settings.state_dir)
    run_id = time.strftime("%Y%m%d-%H%M%S")
    work = settings.base_dir / run_id
    work.mkdir(parents=True, exist_ok=True)
    bootstrap, started = _ensure_broker(state_dir)
    _say(f"broker: {bootstrap}{' (started)' if started else ''}")
    try:
        prefix = f"site-{run_id}-"
        truth_path = work / "ground-truth.json"
        config = SimulationConfig(
            sites=settings.sites,
            topic_prefix=prefix,
            partitions=4,
            sessions_per_site=settings.sessions_per_site,
            rows_per_snapshot=20,
            messages=settings.messages,
            restart_every=500,
            faults=FaultRates(drop=0.002, duplicate=0.002, swap=0.002, malformed=0.002),
            faulty_sessions=settings.faulty_sessions,
            seed=7,
        )
        _say(f"simulating {settings.sites} sites, {settings.messages:,} messages ...")
        result = simulate(config, bootstrap, ground_truth_path=truth_path)
        truth = result.ground_truth
        _say(
            f"produced {truth.records:,} records to {len(truth.topics)} topics "
            f"({len(truth.sessions)} sessions, {len(truth.faults())} injected faults)"
        )

        pipeline_config = load_toml(EXAMPLE_PIPELINE)
        pipeline_config["pipeline"]["checkpoint"] = str(work / "checkpoint")
        pipeline_config["pipeline"]["trigger"] = "available-now"
        pipeline_config["source"]["bootstrap_servers"] = bootstrap
        pipeline_config["source"]["topic_pattern"] = f"{prefix}.*"
        pipeline_config["sink"]["path"] = str(work / "output")
        pipeline_config["spark"]["master"] = settings.master
        pipeline = build_pipeline(pipeline_config)
        summary = pipeline.run()

        changes = read_changes(str(work / "output"))
        tables = rebuild_tables(changes)
        check = verify_tables(tables, truth, changes)
        rows = sum(len(t) for t in tables.values())
        _say("")
        _say(f"sessions rebuilt: {len(tables)}  rows in their tables: {rows:,}")
        _say(f"change rows written: {summary.output_rows:,} in {summary.output_files} files")
        _say(
            "integrity events: "
            + (", ".join(f"{k}={v}" for k, v in sorted(summary.violations.items())) or "none")
        )
        for line in check.lines():
            _say(line)
        output = (work / "output").resolve()
        _say(f"output: {output}")
        _say("query it, e.g.:")
        _say(f"  {query_command(output)}")
        _say(
            "verdict: "
            + (
                "output matches the ground truth"
                if check.ok
                else "OUTPUT DIFFERS FROM THE GROUND TRUTH"
            )
        )
        return check.ok
    finally:
        if started and not settings.keep_running:
            services.down(state_dir, only=["kafka"])
