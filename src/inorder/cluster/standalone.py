"""A Spark standalone cluster on 127.0.0.1 from the pip-installed pyspark: one Master, N Workers.

Everything lives in one state directory (default ``.inorder/cluster``)::

    cluster.json         pids + start times, ports, master URL, worker settings
    master.log           the Master's output
    worker-<i>.log       each Worker's output
    work/worker-<i>/     each Worker's work dir (executor stdout/stderr, unpacked archives)

Each daemon is started with ``spark-class`` (which ``exec``s the JVM, so the recorded pid is
the JVM's) as the leader of its own process group: stopping the group also stops the
executors a Worker launched. A process is identified by pid *and* kernel start time, so a
recycled pid is never signalled. Health comes from the Master's JSON UI (``/json/``), which
is bound to 127.0.0.1 through ``SPARK_LOCAL_IP`` like every other Spark port.

Workers launch Python workers with ``PYSPARK_PYTHON`` (default: this interpreter). Without it
executors start the system python, which lacks pyarrow, and the only error is
"Python worker failed to connect back".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inorder.dev.processes import (
    free_ports,
    process_alive,
    process_start_time,
    reap,
    spawn,
    stop_process,
    tcp_open,
)
from inorder.errors import InorderError

HOST = "127.0.0.1"
STATE_FILE = "cluster.json"
ENV_STATE_DIR = "INORDER_CLUSTER_STATE_DIR"
DEFAULT_STATE_DIR = Path(".inorder/cluster")
START_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class ClusterError(InorderError):
    """The standalone cluster could not be started, stopped or reached."""


@dataclass
class ClusterSpec:
    """The shape of a cluster: how many workers, and what each offers to executors."""

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    master_port: int = 0  # 0: a free port
    python: str = field(default_factory=lambda: sys.executable)

    def validate(self) -> None:
        """Reject impossible values with a message naming the option."""
        if self.workers < 1:
            raise ClusterError(f"--workers must be at least 1, not {self.workers}")
        if self.cores < 1:
            raise ClusterError(f"--cores must be at least 1, not {self.cores}")
        if not self.memory[:-1].isdigit() or self.memory[-1].lower() not in "mg":
            raise ClusterError(f"--memory must look like 1024m or 1g, not {self.memory!r}")


@dataclass
class DaemonRecord:
    """One running daemon as recorded in ``cluster.json``."""

    role: str  # "master" or "worker-<i>"
    pid: int
    start_time: str | None
    port: int
    ui_port: int
    log: str

    def alive(self) -> bool:
        """True while the recorded process (same pid, same start time) runs."""
        return process_alive(self.pid, self.start_time)


@dataclass
class ClusterStatus:
    """What ``status`` (and ``up``) report."""

    state: str  # "running", "degraded", "not running"
    master_url: str | None = None
    ui_url: str | None = None
    alive_workers: int = 0
    expected_workers: int = 0
    daemons: list[dict[str, Any]] = field(default_factory=list)
    detail: str = ""

    @property
    def healthy(self) -> bool:
        """All recorded daemons run and the master sees every worker ALIVE."""
        return self.state == "running"


def resolve_state_dir(state_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cluster state directory: argument, else ``$INORDER_CLUSTER_STATE_DIR``, else default."""
    if state_dir is not None:
        return Path(state_dir)
    env = os.environ.get(ENV_STATE_DIR)
    return Path(env) if env else DEFAULT_STATE_DIR


def spark_home() -> Path:
    """The pip-installed pyspark directory, which is a complete Spark distribution."""
    try:
        import pyspark
    except ImportError:  # pragma: no cover - pyspark is a dependency
        raise ClusterError("pyspark is not installed in this environment") from None
    return Path(pyspark.__file__).resolve().parent


def spark_class() -> Path:
    """Path of ``bin/spark-class`` inside the pyspark package."""
    path = spark_home() / "bin" / "spark-class"
    if not path.exists():
        raise ClusterError(f"{path} not found: is pyspark installed completely?")
    return path


def daemon_env(python: str) -> dict[str, str]:
    """Environment of the master and workers (inherited by executors and Python workers)."""
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": HOST,  # every port, the web UIs included, on loopback only
            "SPARK_LOCAL_HOSTNAME": HOST,
            "SPARK_PUBLIC_DNS": HOST,
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
        }
    )
    # spark-class reads conf/spark-env.sh from SPARK_CONF_DIR: never pick up a stray one.
    env.pop("SPARK_CONF_DIR", None)
    return env


class StandaloneCluster:
    """Start, stop, inspect one standalone cluster recorded in a state directory."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None) -> None:
        self.state_dir = resolve_state_dir(state_dir).absolute()

    # -- state file --------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        """``<state-dir>/cluster.json``."""
        return self.state_dir / STATE_FILE

    def read_state(self) -> dict[str, Any]:
        """The recorded state, ``{}`` when nothing was started here."""
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot read {self.state_file}: {exc}") from None
        return data

    def _write_state(self, data: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.state_file)

    def _daemons(self, data: dict[str, Any]) -> list[DaemonRecord]:
        records = []
        if data.get("master"):
            records.append(DaemonRecord(**data["master"]))
        records.extend(DaemonRecord(**w) for w in data.get("workers", []) if w)
        return records

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>`` of the recorded master."""
        data = self.read_state()
        if not data.get("master"):
            raise ClusterError(f"no cluster recorded in {self.state_dir}; run `inorder cluster up`")
        return f"spark://{HOST}:{data['master']['port']}"

    # -- starting ----------------------------------------------------------------------------

    def _spawn(
        self,
        role: str,
        argv: list[str],
        python: str,
        die_with_parent: bool,
        extra_env: dict[str, str] | None = None,
    ) -> int:
        # Its own process group, so stopping the daemon stops its executors too.
        pid, _ = spawn(
            [str(spark_class()), *argv],
            self.state_dir / f"{role}.log",
            self.state_dir,
            die_with_parent,
            env={**daemon_env(python), **(extra_env or {})},
        )
        return pid

    def _record(self, role: str, pid: int, port: int, ui_port: int) -> dict[str, Any]:
        return asdict(
            DaemonRecord(
                role=role,
                pid=pid,
                start_time=process_start_time(pid),
                port=port,
                ui_port=ui_port,
                log=str(self.state_dir / f"{role}.log"),
            )
        )

    def up(self, spec: ClusterSpec | None = None, die_with_parent: bool = False) -> ClusterStatus:
        """Start the master and workers unless a healthy cluster is recorded here already.

        ``die_with_parent``: the daemons get SIGTERM when this process dies (test fixtures).
        """
        spec = spec or ClusterSpec()
        spec.validate()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        current = self.status()
        if current.state != "not running":
            if current.healthy:
                current.detail = "already running"
                return current
            self.down()  # a half-dead cluster: start over cleanly
        master_port, master_ui = free_ports(2)
        if spec.master_port:
            master_port = spec.master_port
        argv = [MASTER_CLASS, "--host", HOST, "--port", str(master_port)]
        argv += ["--webui-port", str(master_ui)]
        pid = self._spawn("master", argv, spec.python, die_with_parent)
        data: dict[str, Any] = {
            "spark_home": str(spark_home()),
            "python": spec.python,
            "spec": {"workers": spec.workers, "cores": spec.cores, "memory": spec.memory},
            "master": self._record("master", pid, master_port, master_ui),
            "workers": [],
        }
        self._write_state(data)
        try:
            self._wait(
                lambda: tcp_open(master_port) and self._master_json(master_ui) is not None,
                DaemonRecord(**data["master"]),
                "master",
            )
            for index in range(spec.workers):
                data["workers"].append(self._start_worker(index, data, die_with_parent))
                self._write_state(data)
            self._wait(
                lambda: self._alive_workers(master_ui) >= spec.workers,
                DaemonRecord(**data["master"]),
                f"{spec.workers} workers to register",
            )
        except BaseException:
            self.down()
            raise
        status = self.status()
        status.detail = "started"
        return status

    def _start_worker(self, index: int, data: dict[str, Any], die_with_parent: bool) -> Any:
        role = f"worker-{index}"
        spec = data["spec"]
        work_dir = self.state_dir / "work" / role
        # A temp dir per worker, as on separate machines: executors keep their local state
        # caches there, so a task that moves to another worker really starts without one.
        tmp_dir = self.state_dir / "tmp" / role
        for path in (work_dir, tmp_dir):
            path.mkdir(parents=True, exist_ok=True)
        port, ui_port = free_ports(2)
        argv = [
            WORKER_CLASS,
            "--host",
            HOST,
            "--port",
            str(port),
            "--webui-port",
            str(ui_port),
            "--cores",
            str(spec["cores"]),
            "--memory",
            str(spec["memory"]),
            "--work-dir",
            str(work_dir),
            f"spark://{HOST}:{data['master']['port']}",
        ]
        env = {"TMPDIR": str(tmp_dir)}
        pid = self._spawn(role, argv, data["python"], die_with_parent, env)
        return self._record(role, pid, port, ui_port)

    def _wait(self, ready: Any, daemon: DaemonRecord, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            if not daemon.alive():
                raise ClusterError(
                    f"Spark {daemon.role} exited while waiting for {what}: "
                    f"{_last_lines(Path(daemon.log))} (log: {daemon.log})"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {START_TIMEOUT:.0f} s waiting for {what} (log: {daemon.log})"
                )
            time.sleep(0.3)

    def _master_json(self, ui_port: int) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{ui_port}/json/", timeout=3) as resp:
                doc: dict[str, Any] = json.loads(resp.read())
                return doc
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def _alive_workers(self, ui_port: int) -> int:
        doc = self._master_json(ui_port) or {}
        return sum(1 for w in doc.get("workers", []) if w.get("state") == "ALIVE")

    # -- workers and executors while running -------------------------------------------------

    def worker(self, index: int) -> DaemonRecord:
        """The recorded worker ``index``."""
        workers = self.read_state().get("workers", [])
        if not 0 <= index < len(workers):
            raise ClusterError(f"no worker {index} recorded in {self.state_file}")
        return DaemonRecord(**workers[index])

    def kill_worker(self, index: int, sig: int = signal.SIGKILL) -> int:
        """Signal worker ``index`` (its JVM only: its executors notice and exit); its pid."""
        record = self.worker(index)
        if not record.alive():
            raise ClusterError(f"worker {index} (pid {record.pid}) is not running")
        os.kill(record.pid, sig)
        return record.pid

    def restart_worker(self, index: int, die_with_parent: bool = False) -> DaemonRecord:
        """Stop worker ``index`` if it still runs, start a fresh one, wait until it registered."""
        data = self.read_state()
        record = self.worker(index)
        stop_process(record.pid, record.start_time, STOP_TIMEOUT)
        data["workers"][index] = self._start_worker(index, data, die_with_parent)
        self._write_state(data)
        master = DaemonRecord(**data["master"])
        expected = len(data["workers"])
        self._wait(lambda: self._alive_workers(master.ui_port) >= expected, master, "worker")
        return DaemonRecord(**data["workers"][index])

    def executor_pids(self, index: int | None = None) -> list[int]:
        """Executor JVMs launched by worker ``index`` (every worker when ``None``)."""
        workers = self.read_state().get("workers", [])
        chosen = workers if index is None else [workers[index]]
        parents = {int(w["pid"]) for w in chosen if w}
        return [pid for pid, ppid in executor_processes() if ppid in parents]

    # -- stopping and status -----------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop exactly the recorded daemons (workers first); the roles that were stopped."""
        data = self.read_state()
        stopped = []
        for record in reversed(self._daemons(data)):
            if stop_process(record.pid, record.start_time, STOP_TIMEOUT):
                stopped.append(record.role)
            reap(record.pid)
        if data:
            with contextlib.suppress(FileNotFoundError):
                self.state_file.unlink()
        return stopped

    def status(self) -> ClusterStatus:
        """Process liveness of each recorded daemon and the workers the master sees ALIVE."""
        data = self.read_state()
        if not data.get("master"):
            return ClusterStatus("not running", detail=f"nothing recorded in {self.state_dir}")
        daemons = self._daemons(data)
        master = daemons[0]
        expected = len(data.get("workers", []))
        doc = self._master_json(master.ui_port) if master.alive() else None
        alive_workers = sum(1 for w in (doc or {}).get("workers", []) if w.get("state") == "ALIVE")
        rows = [{**asdict(d), "alive": d.alive()} for d in daemons]
        if not any(r["alive"] for r in rows):
            state, detail = "not running", "recorded processes are gone"
        elif doc is None:
            state, detail = "degraded", "master UI does not answer"
        elif alive_workers < expected or not all(r["alive"] for r in rows):
            state, detail = "degraded", f"{alive_workers} of {expected} workers alive"
        else:
            state, detail = "running", ""
        return ClusterStatus(
            state=state,
            master_url=f"spark://{HOST}:{master.port}",
            ui_url=f"http://{HOST}:{master.ui_port}",
            alive_workers=alive_workers,
            expected_workers=expected,
            daemons=rows,
            detail=detail,
        )


def executor_processes() -> list[tuple[int, int]]:
    """``(pid, parent pid)`` of every executor JVM on this machine (Linux /proc)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if EXECUTOR_CLASS.encode() not in cmdline:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] not in ("Z", "X"):
            found.append((int(entry.name), int(fields[1])))
    return found


def _last_lines(path: Path, count: int = 3) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "no log"
    return " | ".join(lines[-count:]) or "empty log"
