"""docs/getting-started.md's "Step by step", run verbatim; then every documented read of a
Parquet output, after a batch that failed once its files were staged.

The page's ```bash block runs as written (bash, in a fresh directory holding a copy of
``examples/``, the virtualenv's ``bin`` first on ``PATH``) against the ``inorder dev up`` it
starts itself. That directory's ``.inorder/dev/services.json`` is seeded with free ports (``up``
reuses the ports recorded there), so its services never collide with the test session's.

Then a second pipeline (``--set`` overrides: its own checkpoint, output and full tables) runs
over the same topics in small batches, and its driver fails to create the manifest of batch 1
after the executors staged that batch's files (a storage error injected by a
``sitecustomize`` hook). Every query the docs give (getting-started, ``sinks.md``'s reading
section, ``sessions.md``'s SQL) must then return exactly what the committed data gives.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.compute as pc
import pytest

from inorder.dev.ground_truth import GroundTruth
from inorder.dev.processes import free_ports
from inorder.dev.simulator import load_ground_truth
from inorder.dev.verify import verify_tables
from inorder.sessions.rebuild import rebuild_tables
from inorder.sinks.parquet import STAGED_SUFFIX, manifest_name, read_committed

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
VENV_BIN = Path(sys.executable).parent
OPS = {"clear", "reset", "insert", "update", "delete", "end"}
DEMO_OUTPUT = ".inorder/demo/output"
DEMO_TABLES = ".inorder/demo/tables"
FAILED = ".inorder/failed"
HOOK = """
import os

_target = os.environ.get("INORDER_E2E_FAIL_CREATE")
if _target:
    from inorder.storage import fs as _fs

    _real = _fs.put_if_absent

    def _failing(location, path, data, *args, **kwargs):
        if str(path).endswith(_target):
            raise OSError(f"simulated storage failure creating {path}")
        return _real(location, path, data, *args, **kwargs)

    _fs.put_if_absent = _failing
"""


def section(doc: Path, heading: str) -> str:
    """The text of one ``## heading`` section of a markdown file."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def code_blocks(text: str, lang: str) -> list[str]:
    """The fenced blocks of ``text`` whose info string is ``lang`` (``""``: none)."""
    blocks: list[str] = []
    current: list[str] | None = None
    keep = False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, keep = [], line[3:].strip() == lang
            else:
                if keep:
                    blocks.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def sql_statements(doc: Path) -> list[str]:
    """Every SQL statement of a markdown file's ```sql blocks."""
    statements = []
    for block in code_blocks(doc.read_text(encoding="utf-8"), "sql"):
        statements += [s.strip() for s in block.split(";") if s.strip()]
    return statements


def shell_env(work: Path, extra: Mapping[str, str] = {}) -> dict[str, str]:
    """A user's shell after `source .venv/bin/activate`: no test-session service settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("INORDER_", "PYSPARK_")) and k not in _AWS_KEYS
    }
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    return {**env, **extra}


_AWS_KEYS = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
}


def bash(script: str, work: Path, env: dict[str, str], timeout: float = 300) -> str:
    return bash_output(script, work, env, timeout)[0]


def bash_output(
    script: str, work: Path, env: dict[str, str], timeout: float = 300
) -> tuple[str, str]:
    """``(stdout, stderr)`` of ``script``, which must succeed."""
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done.stdout, done.stderr


def coverage(truth: GroundTruth, changes: Any, stderr: str) -> str:
    """What a short read missed: per topic-partition, the broker's end offset after the
    simulator's flush against the highest offset in the output; and the run's own lines."""
    seen: dict[tuple[str, int], int] = {}
    for t, p, o in zip(
        changes.column("topic").to_pylist(),
        changes.column("partition").to_pylist(),
        changes.column("offset").to_pylist(),
        strict=True,
    ):
        seen[(t, p)] = max(o, seen.get((t, p), -1))
    short = [
        f"{name}/{p}: broker end offset {end} after the simulator's flush, "
        f"output up to {seen.get((name, p), 'none')}"
        for name, topic in sorted(truth.topics.items())
        for p, end in sorted(topic.end_offsets.items())
        if end > 0 and seen.get((name, p), -1) < end - 1
    ]
    run_lines = [ln for ln in stderr.splitlines() if "rdkafka" not in ln][-40:]
    return "\n".join(["partitions read short:", *short, "--- the run's stderr", *run_lines])


def printed_counts(text: str) -> dict[str, int]:
    """``op -> rows`` from the table DuckDB's ``.show()`` prints."""
    return {op: int(n) for op, n in re.findall(r"│\s*([a-z]+)\s*│\s*(\d+)\s*│", text)}


def committed_counts(table: Any) -> dict[str, int]:
    counts = table.group_by("op").aggregate([("op", "count")])
    return dict(zip(counts["op"].to_pylist(), counts["op_count"].to_pylist(), strict=True))


def canonical(rows: list[tuple[Any, ...]]) -> list[str]:
    return sorted(repr(r) for r in rows)


@pytest.fixture
def work(tmp_path: Path) -> Any:
    """A fresh directory like the repository's root: ``examples/``, and dev services whose
    recorded ports are free ones; ``inorder dev down`` runs whatever happens."""
    work = tmp_path / "w"
    shutil.copytree(ROOT / "examples", work / "examples")
    state = work / ".inorder" / "dev"
    state.mkdir(parents=True)
    kafka_port, s3_port, registry_port = free_ports(3)
    services = {
        "kafka": {"port": kafka_port},
        "s3": {"port": s3_port},
        "registry": {"port": registry_port},
    }
    (state / "services.json").write_text(json.dumps(services), encoding="utf-8")
    (state / "services.json").chmod(0o600)
    try:
        yield work
    finally:
        subprocess.run(
            [str(VENV_BIN / "inorder"), "dev", "down"],
            cwd=work,
            env=shell_env(work),
            capture_output=True,
            timeout=120,
        )


@pytest.mark.timeout(600)
def test_getting_started_verbatim_then_every_documented_query_after_a_failed_batch(
    work: Path,
) -> None:
    steps = code_blocks(section(DOCS / "getting-started.md", "Step by step"), "bash")
    assert len(steps) == 1, "the Step by step section has one ```bash block"
    script = steps[0]
    assert "inorder dev up" in script and "inorder dev down" in script

    # 1. The page, verbatim.
    printed, stderr = bash_output(script, work, shell_env(work))
    counts = printed_counts(printed)
    assert counts and set(counts) <= OPS, printed
    assert {"clear", "insert", "update", "delete"} <= set(counts), printed
    changes = read_committed(str(work / DEMO_OUTPUT))
    assert counts == committed_counts(changes)
    truth = load_ground_truth(work / "truth.json")
    assert sum(counts.values()) >= truth.records > 0, coverage(truth, changes, stderr)
    check = verify_tables(rebuild_tables(changes), truth, changes)
    assert check.ok, check.lines()
    shown = code_blocks(section(DOCS / "getting-started.md", "Step by step"), "")
    assert shown and printed_counts(shown[0]) == counts, "the page shows what the query prints"

    # 2. A batch that fails after its files were staged, on a second pipeline.
    hook = work / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK, encoding="utf-8")
    output, tables = work / FAILED / "output", work / FAILED / "tables"
    bash("inorder dev up", work, shell_env(work))
    failing = subprocess.run(
        [
            str(VENV_BIN / "inorder"),
            "run",
            "examples/sessions.toml",
            "--progress",
            "plain",
            "--set",
            f"pipeline.checkpoint={FAILED}/checkpoint",
            "--set",
            f"sink.path={FAILED}/output",
            "--set",
            "materialized.every=1",
            "--set",
            f"materialized.path={FAILED}/tables",
            "--set",
            "source.max_offsets_per_trigger=8000",
        ],
        cwd=work,
        env=shell_env(
            work,
            {
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p
                ),
                "INORDER_E2E_FAIL_CREATE": f"{FAILED}/output/_inorder/commits/{manifest_name(1)}",
            },
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failing.returncode != 0, failing.stdout + failing.stderr
    assert "simulated storage failure" in failing.stdout + failing.stderr
    staged = sorted(
        p.name for p in (output / "_inorder" / "staging" / "1").rglob("*") if p.is_file()
    )
    assert staged and all(n.endswith(STAGED_SUFFIX) for n in staged), staged
    committed = read_committed(str(output))
    assert 0 < committed.num_rows < changes.num_rows
    assert set(pc.unique(committed.column("batch_id")).to_pylist()) == {0}
    committed_tables = read_committed(str(tables))
    assert committed_tables.num_rows > 0

    # 3. Every documented read sees exactly the committed rows.
    # getting-started.md: the page's query, on this output.
    query = script[script.index("python - <<'EOF'") : script.index("\nEOF\n") + 4]
    printed = bash(query.replace(DEMO_OUTPUT, f"{FAILED}/output"), work, shell_env(work))
    assert printed_counts(printed) == committed_counts(committed)
    # A `**` glob enters _inorder/: the staged files must not match it either.
    globbed = duckdb.sql(f"select count(*) from read_parquet('{output}/**/*.parquet')")
    assert globbed is not None and globbed.fetchall()[0][0] == committed.num_rows
    # sinks.md, "Reading a Parquet dataset": its Python, on this output.
    (reading,) = code_blocks(section(DOCS / "sinks.md", "Reading a Parquet dataset"), "python")
    assert f'root = "{DEMO_OUTPUT}"' in reading
    cwd = os.getcwd()
    namespace: dict[str, Any] = {}
    try:
        os.chdir(work)
        exec(reading.replace(DEMO_OUTPUT, f"{FAILED}/output"), namespace)
        exact = namespace["exact"].fetchall()
        assert namespace["by_list"].fetchall() == exact
        assert namespace["globbed"].fetchall() == exact
    finally:
        os.chdir(cwd)
    assert sum(n for _, _, n in exact) == committed.num_rows
    assert namespace["listed"].num_rows == committed.num_rows
    assert namespace["changes"].num_rows == committed.num_rows
    # sessions.md: every SQL query, on this output and its full tables, against the same
    # query on the committed rows.
    statements = sql_statements(DOCS / "sessions.md")
    assert len(statements) >= 5
    con = duckdb.connect()
    con.register("committed_output", committed)
    con.register("committed_tables", committed_tables)
    scans = {DEMO_OUTPUT: (output, "committed_output"), DEMO_TABLES: (tables, "committed_tables")}
    nonempty = 0
    for sql in statements:
        on_files, on_committed = sql, sql
        for documented, (path, name) in scans.items():
            scan = f"read_parquet('{documented}/*/*.parquet', hive_partitioning = true)"
            on_files = on_files.replace(scan, scan.replace(documented, str(path)))
            on_committed = on_committed.replace(scan, name)
        assert on_files != sql, f"a query reads no documented path:\n{sql}"
        got = con.sql(on_files).fetchall()
        assert canonical(got) == canonical(con.sql(on_committed).fetchall()), sql
        nonempty += bool(got)
    assert nonempty >= 4


@pytest.mark.timeout(600)
def test_getting_started_with_avro_verbatim(work: Path) -> None:
    """The Avro path: registry-framed sessions, read back exactly as the simulator sent them."""
    steps = code_blocks(
        section(DOCS / "getting-started.md", "Step by step with Avro and a schema registry"),
        "bash",
    )
    assert len(steps) == 1, "the Avro section has one ```bash block"
    script = steps[0]
    assert "--format avro" in script and "inorder dev down" in script
    printed, stderr = bash_output(script, work, shell_env(work))
    counts = printed_counts(printed)
    assert {"clear", "insert", "update", "delete"} <= set(counts), printed
    changes = read_committed(str(work / ".inorder/avro/output"))
    assert counts == committed_counts(changes)
    truth = load_ground_truth(work / "avro-truth.json")
    assert sum(counts.values()) >= truth.records > 0, coverage(truth, changes, stderr)
    check = verify_tables(rebuild_tables(changes), truth, changes)
    assert check.ok, check.lines()
    registry = json.loads((work / ".inorder/dev/registry/registry.json").read_text())
    assert sorted(registry["subjects"]) == sorted(f"{t}-value" for t in truth.topics)
