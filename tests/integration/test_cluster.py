"""The session-table pipeline on real Spark clusters, with output on S3, against ground truth.

- ``local-cluster[2,1,1024]`` (separate executor JVMs), with one executor killed mid-run;
- the standalone cluster (``inorder cluster up``) through ``inorder run --master spark://``,
  with one worker killed mid-run;
- the standalone cluster through the ``spark-submit`` command written in ``docs/cluster.md``,
  with the environment archive built by ``inorder package``.

Each Spark job runs in a subprocess (the test process holds a local[2] SparkContext, and a
JVM holds one). A run that fails because of the kill is restarted once, as a supervisor
would; the output must be exact either way: no duplicate and no missing change row, every
session's table equal to the simulator's ground truth. Workers get separate temp dirs, so a
partition whose task moves starts without a local state cache and must restore its state
from the checkpoint (a lost state would show as violations and wrong tables).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.fixtures.sessions_job import assert_matches_truth, two_partition_simulation
from tests.fixtures.spark import LOCAL_CLUSTER_MASTER

from inorder.cluster.standalone import (
    StandaloneCluster,
    executor_processes,
    process_start_time,
)
from inorder.dev.simulator import GroundTruth, simulate
from inorder.sessions.rebuild import read_changes

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
#: A safety net, not a speed bound: packing the environment alone takes minutes when busy.
RUN_TIMEOUT = 600
#: The simulated sites: two, of 15 sessions each, restarting every 150 messages of a session.
SESSIONS = {"sites": 2, "sessions_per_site": 15, "rows_per_snapshot": 8, "restart_every": 150}


# -- helpers -----------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
        )
    return json.dumps(value)


def _write_pipeline(
    path: Path,
    *,
    kafka: Any,
    s3: Any,
    prefix: str,
    sink: str,
    checkpoint: Path,
    master: str,
    max_offsets: int,
    executor_env: bool,
) -> Path:
    """A session-table pipeline TOML; S3 credentials reach executors via ``executorEnv``."""
    conf: dict[str, str] = {"spark.task.maxFailures": "8"}
    if executor_env:
        # Standalone executors inherit the *worker's* environment, not the driver's.
        for key, value in s3.storage_options().items():
            conf[f"spark.executorEnv.{key}"] = value
    config = {
        "pipeline": {
            "name": "cluster-test",
            "checkpoint": str(checkpoint),
            "trigger": "available-now",
            "progress": "json",
            # The simulation's faulty sessions are reset by design: judged by exactness
            # against the truth, not by the set-aside exit code (3).
            "set_aside_exit_code": 0,
        },
        "source": {
            "bootstrap_servers": kafka.bootstrap_servers,
            "topic_pattern": f"{prefix}.*",
            "max_offsets_per_trigger": max_offsets,
        },
        "processor": {"type": "sessions"},
        "integrity": {"on_violation": "restart_session"},
        "sink": {"path": sink, "partition_by": ["topic"]},
        "spark": {"master": master, "conf": conf},
    }
    lines = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)  # it holds the S3 secret
    return path


def _simulated_pipeline(
    kafka: Any,
    s3: Any,
    work: Path,
    tag: str,
    *,
    seed: int,
    master: str,
    messages: int = 3000,
    max_offsets: int = 700,
    executor_env: bool = True,
) -> tuple[GroundTruth, str, Path]:
    """Simulated topics ``<tag>-N-*`` and a session-table pipeline from them to a fresh S3 path.

    The pipeline's TOML is ``work/pipeline.toml``, its checkpoint ``work/checkpoint``; returns
    the simulator's truth, the output's path and the TOML file.
    """
    prefix = f"{tag}-{random.randrange(10**9)}-"
    simulation = two_partition_simulation(prefix, seed, messages=messages, faulty=0.1, **SESSIONS)
    truth = simulate(simulation, kafka.bootstrap_servers).ground_truth
    sink = s3.new_prefix()
    toml = _write_pipeline(
        work / "pipeline.toml",
        kafka=kafka,
        s3=s3,
        prefix=prefix,
        sink=sink,
        checkpoint=work / "checkpoint",
        master=master,
        max_offsets=max_offsets,
        executor_env=executor_env,
    )
    return truth, sink, toml


def _driver_env(s3: Any, python: bool = True) -> dict[str, str]:
    env = {**os.environ, **s3.storage_options(), "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME"):
        env.pop(key, None)
    if python:
        env["PYSPARK_PYTHON"] = sys.executable
    return env


def _run(
    argv: list[str], env: dict[str, str], cwd: Path, on_batch: Callable[[int], None] | None = None
) -> tuple[int, list[dict[str, Any]], str]:
    """Run a driver; call ``on_batch(batch_id)`` per JSON progress line; (rc, events, stderr)."""
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr or []), daemon=True)
    reader.start()
    events: list[dict[str, Any]] = []
    timer = threading.Timer(RUN_TIMEOUT, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in proc.stdout or []:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            events.append(event)
            if event.get("event") == "batch" and on_batch is not None:
                on_batch(int(event["batch_id"]))
        rc = proc.wait()
    finally:
        timer.cancel()
        with_suppressed_kill(proc.pid)
    reader.join(10)
    return rc, events, "".join(stderr)


def with_suppressed_kill(pgid: int) -> None:
    """Kill what is left of a driver's process group (its JVM can outlive a killed python)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _errors(stderr: str) -> str:
    keep = [x for x in stderr.splitlines() if "Error" in x or "error:" in x or "Exception" in x]
    return "\n".join(keep[-15:]) or stderr[-2000:]


def _run_until_done(
    argv: list[str], env: dict[str, str], cwd: Path, on_batch: Callable[[int], None]
) -> tuple[list[dict[str, Any]], int, str]:
    """Run; if the run fails (the kill broke the query), restart it once, like a supervisor.

    Returns the events, the number of restarts and the first run's stderr.
    """
    rc, events, first_stderr = _run(argv, env, cwd, on_batch)
    restarts, stderr = 0, first_stderr
    if rc != 0:
        restarts = 1
        rc, more, stderr = _run(argv, env, cwd, None)
        events += more
    assert rc == 0, _errors(stderr)
    return events, restarts, first_stderr


#: What the driver logs (at ERROR, the level the runner leaves on) when it loses an executor.
LOST_EXECUTOR = re.compile(r"Lost executor \d+", re.I)


def _spark_log(checkpoint: Path) -> str:
    """What Spark logged during the run: its log goes to the run log, not the terminal."""
    from inorder.checkpoint.names import RUN_LOG_FILE

    path = checkpoint / RUN_LOG_FILE
    return path.read_text(errors="replace") if path.exists() else ""


def _assert_exact(sink: str, s3: Any, truth: GroundTruth) -> int:
    changes = read_changes(sink, storage_options=s3.storage_options())
    check = assert_matches_truth(changes, truth)
    assert check.exact > 0
    return int(changes.num_rows)


def _records(events: list[dict[str, Any]]) -> int:
    return sum(int(e.get("records", 0)) for e in events if e.get("event") == "batch")


# -- the standalone cluster itself ------------------------------------------------------------


@pytest.mark.cluster
def test_cluster_status_reports_workers_and_binds_loopback(
    standalone_cluster: StandaloneCluster,
) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "inorder.cli",
            "cluster",
            "status",
            "--json",
            "--state-dir",
            str(standalone_cluster.state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["state"] == "running"
    assert doc["alive_workers"] == doc["expected_workers"] == 2
    assert doc["master_url"] == standalone_cluster.master_url
    # Every listening socket of the master (RPC and web UI) is on loopback.
    master_pid = doc["daemons"][0]["pid"]
    listening = _listening_addresses(master_pid)
    assert listening, "master has no listening sockets?"
    assert all(addr.startswith("127.0.0.1") for addr in listening), listening


def _listening_addresses(pid: int) -> list[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        match = re.fullmatch(r"socket:\[(\d+)\]", target)
        if match:
            inodes.add(match.group(1))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                raw = bytes.fromhex(cols[1].split(":")[0])
                # /proc/net/tcp* print each 32-bit word of the address in host (little) order.
                addr = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                if len(addr) == 16 and addr[:12] == b"\0" * 10 + b"\xff\xff":
                    addr = addr[12:]  # IPv4-mapped IPv6
                ip = ".".join(str(b) for b in addr) if len(addr) == 4 else addr.hex()
                found.append(ip)
    return found


def test_down_never_signals_a_recycled_pid(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = {
            "role": "master",
            "pid": sleeper.pid,
            "start_time": "1",  # not sleeper's start
            "port": 1,
            "ui_port": 1,
            "log": str(tmp_path / "master.log"),
        }
        (tmp_path / "cluster.json").write_text(json.dumps({"master": record, "workers": []}))
        cluster = StandaloneCluster(tmp_path)
        assert cluster.status().state == "not running"
        assert cluster.down() == []
        assert sleeper.poll() is None, "a process that is not ours was signalled"
        record["start_time"] = process_start_time(sleeper.pid)
        (tmp_path / "cluster.json").write_text(json.dumps({"master": record, "workers": []}))
        assert StandaloneCluster(tmp_path).down() == ["master"]
        assert sleeper.wait(10) is not None
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_cluster_up_rejects_bad_options_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "inorder.cli",
            "cluster",
            "up",
            "--workers",
            "0",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.strip() == "inorder: error: --workers must be at least 1, not 0"


# -- pipelines on clusters --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.cluster
def test_local_cluster_executor_killed_mid_run_output_exact(
    kafka: Any, s3: Any, tmp_path: Path
) -> None:
    truth, sink, toml = _simulated_pipeline(
        kafka,
        s3,
        tmp_path,
        "lc",
        seed=21,
        master=LOCAL_CLUSTER_MASTER,
        messages=1500,
        executor_env=False,
    )
    killed: list[int] = []

    def kill_one_executor() -> None:
        ours = [pid for pid, _ in executor_processes() if _in_dir(pid, tmp_path)]
        if ours:
            os.kill(ours[0], signal.SIGKILL)
            killed.append(ours[0])

    def after_first_batch(batch_id: int) -> None:
        # Placed by the batch, not by seconds: the later batches (700 records each) run
        # after the loss however fast they are on this machine.
        if batch_id == 0:
            kill_one_executor()

    argv = [sys.executable, "-m", "inorder.cli", "run", str(toml)]
    events, restarts, stderr = _run_until_done(argv, _driver_env(s3), tmp_path, after_first_batch)
    assert killed, "no executor of this run was found to kill"
    assert not LOST_EXECUTOR.search(stderr), "Spark's log reached the terminal"
    assert LOST_EXECUTOR.search(_spark_log(tmp_path / "checkpoint")), "executor loss unnoticed"
    assert _records(events) >= truth.records
    rows = _assert_exact(sink, s3, truth)
    print(f"local-cluster: executor {killed[0]} killed, {restarts} restart(s), {rows} rows exact")


def _in_dir(pid: int, root: Path) -> bool:
    """True if ``pid`` (an executor JVM) belongs to the driver started in ``root``."""
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return Path(f"/proc/{parent}/cwd").resolve() == root.resolve()
    except (OSError, ValueError, IndexError):
        return False


@pytest.mark.slow
@pytest.mark.cluster
def test_standalone_worker_killed_mid_run_output_exact(
    standalone_cluster: StandaloneCluster,
    spark_standalone: str,
    kafka: Any,
    s3: Any,
    tmp_path: Path,
) -> None:
    # The pipeline's master is replaced by --master.
    truth, sink, toml = _simulated_pipeline(
        kafka, s3, tmp_path, "sa", seed=22, master="local[1]", messages=1500
    )
    killed: list[int] = []

    def kill_worker() -> None:
        killed.append(standalone_cluster.kill_worker(0))

    def after_first_batch(batch_id: int) -> None:
        # Placed by the batch, not by seconds: the later batches (700 records each) run
        # after the loss however fast they are on this machine.
        if batch_id == 0:
            kill_worker()

    argv = [sys.executable, "-m", "inorder.cli", "run", str(toml), "--master", spark_standalone]
    try:
        events, restarts, stderr = _run_until_done(
            argv, _driver_env(s3), tmp_path, after_first_batch
        )
    finally:
        standalone_cluster.restart_worker(0, die_with_parent=True)
    assert killed
    assert not LOST_EXECUTOR.search(stderr), "Spark's log reached the terminal"
    assert LOST_EXECUTOR.search(_spark_log(tmp_path / "checkpoint")), "executor loss unnoticed"
    assert _records(events) >= truth.records
    rows = _assert_exact(sink, s3, truth)
    print(f"standalone: worker {killed[0]} killed, {restarts} restart(s), {rows} rows exact")


def documented_submit_commands() -> str:
    """The shell block after ``<!-- test: spark-submit -->`` in docs/cluster.md."""
    text = (ROOT / "docs" / "cluster.md").read_text()
    match = re.search(r"<!-- test: spark-submit -->\s*```(?:bash|sh)\n(.*?)```", text, re.S)
    assert match, "docs/cluster.md lost its tested spark-submit block"
    return match.group(1)


@pytest.mark.slow
@pytest.mark.cluster
def test_documented_spark_submit_runs_on_standalone_with_packed_env(
    standalone_cluster: StandaloneCluster,
    spark_standalone: str,
    kafka: Any,
    s3: Any,
    tmp_path: Path,
) -> None:
    # The pipeline's master gives way to spark-submit's --master.
    truth, sink, _ = _simulated_pipeline(
        kafka, s3, tmp_path, "ss", seed=23, master="local[1]", messages=1500, max_offsets=1000
    )
    script = documented_submit_commands().replace("spark://127.0.0.1:7077", spark_standalone)
    assert "spark-submit" in script and "--archives" in script
    seen: set[str] = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_python_workers, args=(seen, stop), daemon=True)
    watcher.start()
    try:
        rc, events, stderr = _run(
            ["bash", "-euo", "pipefail", "-c", script], _driver_env(s3, python=False), tmp_path
        )
    finally:
        stop.set()
        watcher.join(5)
    assert rc == 0, _errors(stderr)
    assert (tmp_path / "dist" / "inorder-env.tar.gz").is_file()
    summary = [e for e in events if e.get("event") == "summary"]
    assert summary and summary[-1]["records"] == truth.records
    # Python workers on the executors ran the archive's interpreter, unpacked in their work dir.
    assert any(cwd.startswith(str(standalone_cluster.state_dir / "work")) for cwd in seen), seen
    unpacked = list((standalone_cluster.state_dir / "work").glob("worker-*/app-*/*/env/bin/python"))
    assert unpacked, "the archive was not unpacked on any executor"
    rows = _assert_exact(sink, s3, truth)
    print(f"spark-submit: {rows} rows exact")
    shutil.rmtree(tmp_path / "env", ignore_errors=True)


def _watch_python_workers(seen: set[str], stop: threading.Event) -> None:
    """Collect the cwd of every running ``./env/bin/python -m pyspark.daemon|worker``."""
    while not stop.is_set():
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if argv[0] == b"./env/bin/python" and any(b"pyspark" in a for a in argv[1:]):
                    seen.add(str((entry / "cwd").resolve()))
            except OSError:
                continue
        time.sleep(0.5)


# -- Kubernetes manifests ---------------------------------------------------------------------

K8S = ROOT / "deploy" / "k8s"


def test_k8s_manifests_pass_strict_schema_validation() -> None:
    """Every manifest against the Kubernetes 1.30 OpenAPI schemas, unknown fields rejected."""
    validator = shutil.which("kubernetes-validate", path=str(VENV_BIN)) or shutil.which(
        "kubernetes-validate"
    )
    if validator is None:
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[dev]')")
    manifests = sorted(str(p) for p in (K8S / "manifests").glob("*.yaml"))
    assert len(manifests) >= 5
    out = subprocess.run(
        [validator, "--strict", "-k", "1.30.0", *manifests],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ERROR" not in out.stdout + out.stderr
    assert out.stdout.count("passed") + out.stderr.count("passed") >= len(manifests)


def test_k8s_manifests_agree_with_each_other_and_inorder() -> None:
    """What schemas cannot check: names that must match, and the pipeline file itself."""
    import yaml

    from inorder.pipeline.config import validate

    docs = [
        d
        for p in sorted((K8S / "manifests").glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    job = by_kind[("Job", "inorder-sessions")]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure"
    assert ("ServiceAccount", pod["serviceAccountName"]) in by_kind
    container = pod["containers"][0]
    assert container["resources"]["requests"]["memory"]
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims and all(("PersistentVolumeClaim", c) in by_kind for c in claims)
    assert by_kind[("PersistentVolumeClaim", "inorder-checkpoint")]["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]
    secret = by_kind[("Secret", "inorder-s3")]["stringData"]
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    refs += [
        dict(zip(("name", "key"), a.rsplit("=", 1)[1].split(":"), strict=True))
        for a in container["args"]
        if "secretKeyRef" in a
    ]
    assert refs and all(r["name"] == "inorder-s3" and r["key"] in secret for r in refs)
    executor_mount = next(a for a in container["args"] if "checkpoint.mount.path" in a)
    checkpoint_mount = next(
        m["mountPath"] for m in container["volumeMounts"] if m["name"] == "checkpoint"
    )
    assert executor_mount.endswith("=" + checkpoint_mount), (
        "executors must see the same checkpoint path"
    )
    # The pipeline file in the ConfigMap is a valid inorder pipeline with its checkpoint on the PVC.
    import tomllib

    config_map = by_kind[("ConfigMap", "inorder-pipeline")]
    config = validate(tomllib.loads(config_map["data"]["pipeline.toml"]), origin="configmap")
    assert config["pipeline"]["checkpoint"].startswith(checkpoint_mount + "/")
    assert container["args"][-1] == "/etc/inorder/pipeline.toml"
    assert "/opt/inorder/inorder-submit.py" in container["args"]
    # The image provides what the Job runs.
    dockerfile = (K8S / "Dockerfile").read_text()
    assert "openjdk-17-jre-headless" in dockerfile and "inorder-submit.py" in dockerfile
    entrypoint = K8S / "entrypoint.sh"
    assert subprocess.run(["bash", "-n", str(entrypoint)], timeout=30).returncode == 0


# -- the spark-submit entry script (pure argument logic) --------------------------------------


def test_submit_entry_lets_spark_submit_settings_win(tmp_path: Path) -> None:
    import tomllib

    from inorder.cluster.submit_main import run_args

    pipeline = tmp_path / "p.toml"
    pipeline.write_text(
        '[spark]\nmaster = "local[2]"\nconf = { "spark.x" = "file", "spark.y" = "file" }\n'
    )
    conf = {
        "spark.master": "spark://10.0.0.1:7077",
        "spark.app.name": "inorder-submit.py",
        "spark.driver.host": "10.0.0.9",
        "spark.y": "submit",
    }
    args = run_args([str(pipeline), "--progress", "json"], conf)
    assert args[:4] == ["run", str(pipeline), "--progress", "json"]
    assert args[args.index("--master") + 1] == "spark://10.0.0.1:7077"
    merged = tomllib.loads("v = " + args[args.index("--set") + 1].split("=", 1)[1])["v"]
    assert merged == {"spark.x": "file", "spark.y": "submit", "spark.driver.host": "10.0.0.9"}
    # An explicit --master of the user is kept; outside spark-submit nothing is added.
    assert run_args([str(pipeline), "--master", "local[1]"], conf).count("--master") == 1
    assert run_args([str(pipeline)], {}) == ["run", str(pipeline)]
    with pytest.raises(SystemExit):
        run_args(["--trigger", "once"], conf)
