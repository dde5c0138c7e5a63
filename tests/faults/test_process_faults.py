"""Fault matrix, process faults: the driver, a Python worker or an executor dies, or is stopped.

Each case runs the session-table job (``tests/fixtures/sessions_job.py``) as ``inorder run``
subprocesses on a broker of its own (fixed topic names: the same partitions on every run),
injects the fault, lets a later run finish, and checks the output against the simulator's
ground truth (no duplicated change row, every session's table equal to it) and with
``inorder validate`` (no missing, extra or different row). Faults land at known moments:
while armed, :class:`MarkedSessions` writes a marker naming the batch and its Python worker's
pid when a task starts a batch, then holds the task, so the batch cannot commit before the
fault. Random moments come from seeded generators. Every driver run is bounded
(``RUN_TIMEOUT``) and killed by process group; the broker is stopped by pid.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from inorder.assemble import load_target
from inorder.commands.run import dump_toml
from inorder.dev import services
from inorder.dev.simulator import GroundTruth, simulate
from inorder.endpoints import kafka_bootstrap_servers
from inorder.sessions import SessionTables
from inorder.sessions.rebuild import read_changes
from tests.faults.conftest import MatrixRecorder
from tests.fixtures.sessions_job import (
    RESTART_SESSION,
    TWO_LOCAL_CORES,
    duplicate_change_rows,
    sessions_config,
    two_partition_simulation,
    verify_changes,
)
from tests.fixtures.spark import LOCAL_CLUSTER_MASTER

ROOT = Path(__file__).resolve().parents[2]
#: The hard bound of one driver run, in seconds.
RUN_TIMEOUT = 300
#: What a marked task waits before applying its records (seconds): the window for a fault.
HOLD = 4.0
PROCESSOR = f"{__name__}:MarkedSessions"

# -- the marked processor (runs in Spark's Python workers) ------------------------------------

_MARKED: set[int] = set()


class MarkedSessions(SessionTables):
    """The session processor; while ``marker_dir/armed`` exists, it marks and holds each batch.

    On the first record of a batch in a worker process, from the first batch named in
    ``armed`` on, it writes ``marker_dir/<batch>-<pid>-<ns>`` and sleeps the seconds written
    there. Its output is the session processor's, record for record.
    """

    def __init__(self, marker_dir: str = "", **options: Any) -> None:
        super().__init__(**options)
        self.marker_dir = marker_dir

    def __reduce__(self) -> tuple[Any, ...]:
        return (_marked_sessions, (self.marker_dir, super().__reduce__()[1]))

    def process(self, state: Any, msg: Any, ctx: Any) -> Any:
        if ctx.batch_id not in _MARKED:
            _MARKED.add(ctx.batch_id)
            hold, first = "", ""
            try:  # "<seconds> <first batch held>"; the test may disarm at any moment
                if self.marker_dir:
                    text = (Path(self.marker_dir) / "armed").read_text()
                    hold, _, first = text.partition(" ")
            except OSError:
                pass
            if hold and ctx.batch_id >= int(first or 0):
                name = f"{ctx.batch_id}-{os.getpid()}-{time.time_ns()}"
                (Path(self.marker_dir) / name).write_text("")
                time.sleep(float(hold))
        return super().process(state, msg, ctx)


def _marked_sessions(marker_dir: str, args: tuple[Any, ...]) -> MarkedSessions:
    names = ("row_key", "inactivity_timeout", "row_type", "envelope")
    return MarkedSessions(marker_dir, **dict(zip(names, args, strict=True)))


@dataclasses.dataclass(frozen=True)
class Marker:
    batch_id: int
    pid: int


def markers(folder: Path) -> list[Marker]:
    """The markers written so far, oldest first."""
    names = sorted((int(ns), int(b), int(pid)) for b, pid, ns in
                   (p.name.split("-") for p in folder.glob("*-*-*")))  # fmt: skip
    return [Marker(batch, pid) for _, batch, pid in names]


@dataclasses.dataclass
class OwnBroker:
    """A broker this test started (noida-db in ``state_dir``); stopped and restarted by pid."""

    state_dir: Path
    bootstrap_servers: str

    def stop(self) -> None:
        services.down(self.state_dir, only=["kafka"])

    def start(self) -> None:  # on the port and data directory of the first start
        services.up(self.state_dir, only=["kafka"], die_with_parent=True)


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    """A fresh broker on a free port for this test only."""
    state_dir = tmp_path / "broker"
    services.up(state_dir, kafka_port=0, only=["kafka"], die_with_parent=True)
    try:
        yield OwnBroker(state_dir, kafka_bootstrap_servers(state_dir))
    finally:
        services.down(state_dir, only=["kafka"])


class DriverRun:
    """``inorder run TOML --progress json`` in a process group of its own, killed at the end."""

    def __init__(self, toml: Path, *flags: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        command = [sys.executable, "-m", "inorder.cli", "run", str(toml), "--progress", "json"]
        self.proc = subprocess.Popen(
            [*command, *flags], env=child_env(), cwd=toml.parent, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self._readers = [
            threading.Thread(target=self._read_events, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self._timer = threading.Timer(RUN_TIMEOUT, self.kill_9)
        self._timer.start()

    def _read_stderr(self) -> None:
        self.stderr.extend(self.proc.stderr or [])

    def _read_events(self) -> None:
        for line in self.proc.stdout or []:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def kill_9(self) -> None:
        """SIGKILL the whole group: the driver, its JVM and the JVM's Python workers."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._timer.cancel()
            self.kill_9()  # a JVM can outlive its driver
            self.proc.wait()
            for reader in self._readers:
                reader.join(10)

    def error_line(self) -> str:
        """The one ``inorder: error:`` line the run printed last (stderr)."""
        lines = "".join(self.stderr).strip().splitlines()
        errors = [x for x in lines if x.startswith("inorder: ")]
        return errors[-1] if errors else ""

    def records(self) -> int:
        return sum(int(e.get("records", 0)) for e in self.events if e.get("event") == "batch")


def child_env() -> dict[str, str]:
    """Spark's workers on this interpreter; this checkout importable (the marked processor)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": path}


def wait_until(ready: Callable[[], Any], run: DriverRun | None, what: str, timeout: float) -> Any:
    """Poll ``ready`` until it returns something truthy; fail if ``run`` exits or time is up."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if run is not None and not run.alive():
            run.wait(30)
            tail = "".join(run.stderr)[-2000:]
            raise AssertionError(f"the run exited ({run.proc.returncode}) before {what}: {tail}")
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.02)


def wait_for_marker(job: Job, run: DriverRun, batch: int = 1) -> Marker:
    """The first marker of a task of batch ``batch`` or later (one holds now)."""

    def found() -> Marker | None:
        return next((m for m in markers(job.marker_dir) if m.batch_id >= batch), None)

    marker: Marker = wait_until(found, run, f"task of batch {batch}", RUN_TIMEOUT)
    return marker


def finish(toml: Path, *flags: str) -> DriverRun:
    """Run the pipeline until caught up; it must succeed."""
    run = DriverRun(toml, "--trigger", "available-now", *flags)
    rc = run.wait()
    assert rc == 0, "".join(run.stderr)[-3000:]
    return run


# -- the job and its checks -------------------------------------------------------------------


@dataclasses.dataclass
class Job:
    """A simulated session job: its TOML, output, marker folder and ground truth."""

    toml: Path
    output: Path
    marker_dir: Path
    truth: GroundTruth
    records: int

    def arm(self, hold: float = HOLD, first_batch: int = 1) -> None:
        """Hold the first task of each batch from ``first_batch`` on for ``hold`` seconds
        (every case meets its fault in batch 1 or later: holding batch 0 only cost time)."""
        (self.marker_dir / "armed").write_text(f"{hold} {first_batch}")

    def disarm(self) -> None:
        (self.marker_dir / "armed").unlink(missing_ok=True)

    def committed(self) -> list[int]:
        """Batch ids whose commit is done (``_inorder/commits/<id>.done``)."""
        return sorted(int(p.stem) for p in (self.output / "_inorder/commits").glob("*.done"))

    def manifests(self) -> set[int]:
        found = (self.output / "_inorder/commits").glob("*.json")
        return {int(p.name[:20]) for p in found if p.name[:20].isdigit()}


def make_job(
    bootstrap: str,
    work: Path,
    *,
    prefix: str = "pf-",
    seed: int = 7,
    messages: int = 3000,
    max_offsets: int = 600,
    spark: dict[str, Any] | None = None,
) -> Job:
    """Two sites of two partitions each; the marked session processor over them."""
    simulation = two_partition_simulation(
        prefix, seed, sites=2, faulty=0.2, sessions_per_site=8, rows_per_snapshot=5,
        messages=messages, restart_every=120,
    )  # fmt: skip
    result = simulate(simulation, bootstrap)
    marker_dir = work / "markers"
    marker_dir.mkdir(parents=True, exist_ok=True)
    config = sessions_config(
        bootstrap, prefix, work, name="faults", max_offsets=max_offsets,
        trigger="available-now", progress="json", integrity=RESTART_SESSION,
        processor={"type": PROCESSOR, "options": {"marker_dir": str(marker_dir)}},
        spark=spark or TWO_LOCAL_CORES,
    )  # fmt: skip
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(config))
    return Job(toml, work / "output", marker_dir, result.ground_truth, result.records)


def exact_check(
    job: Job, keep: Callable[[Any], Any] | None = None, **validate_args: Any
) -> tuple[bool, str]:
    """The output against the truth and ``inorder validate``: (exact?, the check in words).

    ``keep`` narrows the change rows (an Arrow mask of them), ``validate_args`` the
    validation (``only=``), to what the job's truth covers.
    """
    changes = read_changes(str(job.output))
    if keep is not None:
        changes = changes.filter(keep(changes))
    return exact_verdict(changes, job.truth, job.toml, **validate_args)


def exact_verdict(
    changes: Any, truth: Any, toml: Path, own_process: bool = False, **validate_args: Any
) -> tuple[bool, str]:
    """Change rows against the truth, ``inorder validate`` of the pipeline ``toml``, and
    ``inorder verify --digests`` of its output (commit metadata and every row, no Kafka)."""
    from inorder.ops.validate import validate

    duplicated = duplicate_change_rows(changes)
    tables = verify_changes(changes, truth)
    report = validate(load_target(str(toml)), **validate_args)
    proof_ok, proof = verify_output(toml, own_process)
    missing = sum(p.missing for p in report.partitions)
    extra = sum(p.extra for p in report.partitions)
    different = sum(p.different for p in report.partitions)
    tables_ok = tables.ok and tables.exact + tables.unknown == tables.sessions
    ok = duplicated == 0 and tables_ok and report.ok and proof_ok
    check = (
        f"{'exact' if ok else 'NOT exact'}: {missing} missing, {extra} extra, "
        f"{different} different, {duplicated} duplicated rows; session tables "
        f"{tables.exact}/{tables.sessions} equal the truth ({tables.unknown} not checkable)"
        f"{'' if tables_ok else ': ' + '; '.join(tables.lines()[:3])}; "
        f"validate {'clean' if report.ok else 'NOT clean'}; verify {proof}"
    )
    return ok, check


def verify_output(toml: Path, own_process: bool = False) -> tuple[bool, str]:
    """``inorder verify --digests`` of the pipeline ``toml`` as a user runs it: (clean?, what
    it said). ``own_process`` where the S3 fault proxy runs in this process: a library call
    that waits on the network without releasing the GIL here would stall the proxy."""
    if own_process:
        done = subprocess.run(
            [sys.executable, "-m", "inorder.cli", "verify", str(toml), "--digests"],
            env=child_env(),
            cwd=toml.parent,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    else:
        import io

        from inorder.cli import main

        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(["verify", str(toml), "--digests"])
        out, err = stdout.getvalue(), stderr.getvalue()
    if code == 0:
        return True, "clean"
    problems = [line for line in out.splitlines() if line.strip()][:3]
    return False, f"NOT clean (exit {code}): " + "; ".join(
        problems or err.strip().splitlines()[-3:]
    )


def verified(toml: Path, config: dict[str, Any] | None = None) -> tuple[bool, str]:
    """:func:`verify_output` of a pipeline run from ``config`` (written to ``toml`` first)
    or from ``toml``: ``(clean?, "verify ...")`` for a fault matrix row's check."""
    if config is not None:
        toml.write_text(dump_toml(config))
    ok, said = verify_output(toml)
    return ok, f"verify {said}"


def jvm_descendants(run: DriverRun) -> list[psutil.Process]:
    """The processes under the driver's JVM (Python daemons and workers; executor JVMs)."""
    driver = psutil.Process(run.proc.pid)
    found = []
    for child in driver.children():
        with contextlib.suppress(psutil.Error):
            if "java" in child.name():
                found.extend(child.children(recursive=True))
    return found


def record_and_assert(matrix: MatrixRecorder, ok: bool, check: str, **row: Any) -> None:
    """Record the row, then fail the test if it is not ok."""
    matrix.record(check=check, ok=ok, **row)
    assert ok, check


# -- the cases --------------------------------------------------------------------------------


def test_driver_kill_9_at_random_moments(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    # 15 batches: three kills, each 1 to 3 commits after the last, land well before the end.
    job = make_job(own_broker.bootstrap_servers, tmp_path, seed=11, messages=4500, max_offsets=300)
    rng = random.Random(11)
    kills, seen = 0, 0
    for _ in range(3):
        run = DriverRun(job.toml)
        # After one to three more committed batches, a random moment of the next one. Counted
        # in batches, not seconds: a batch of 300 records takes 0.2 s or 2 s depending on the
        # machine, and a kill after the last batch would test nothing (and end the loop).
        target = seen + rng.randint(1, 3)
        wait_until(lambda: len(job.committed()) >= target, run, "commit", RUN_TIMEOUT)  # noqa: B023
        time.sleep(rng.uniform(0, 0.4))
        run.kill_9()
        run.wait()
        kills += 1
        seen = len(job.committed())
    final = finish(job.toml)
    assert final.records() < job.records, "the last kill must land before the end"
    ok, check = exact_check(job)
    record_and_assert(
        matrix, ok, check, group="process", fault="kill -9 of the driver at random moments",
        times=kills, outcome="continued",
    )  # fmt: skip


def test_python_worker_kill_9_mid_task(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    job = make_job(own_broker.bootstrap_servers, tmp_path, seed=12)
    job.arm()
    run = DriverRun(job.toml)
    marker = wait_for_marker(job, run)
    workers = {p.pid for p in jvm_descendants(run)}
    assert marker.pid in workers, f"worker {marker.pid} is not under the driver's JVM {workers}"
    os.kill(marker.pid, signal.SIGKILL)
    job.disarm()
    rc = run.wait()
    line = run.error_line()
    if rc != 0:
        finish(job.toml)
    ok, check = exact_check(job)
    named = rc == 0 or ("Python worker" in line and "full trace in" in line)
    outcome = "continued" if rc == 0 else "named error"
    what = "the task was retried" if rc == 0 else f"the run ended with {line!r}"
    what = what if named else f"DEFECT (error does not name the cause): {what}"
    row: dict[str, Any] = {
        "group": "process", "fault": "kill -9 of a Python worker mid-task", "times": 1,
        "outcome": outcome, "check": f"{what}; the next run resumed; {check}",
    }  # fmt: skip
    matrix.record(ok=ok and named, **row)
    assert ok, check
    assert named, f"the error does not name the dead worker: {line!r}"


@pytest.mark.slow
def test_executor_kill_on_local_cluster(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    conf = {"spark.executorEnv.PYTHONPATH": str(ROOT), "spark.task.maxFailures": "4"}
    cluster = {"master": LOCAL_CLUSTER_MASTER, "conf": conf}
    # Three batches: the kill lands in batch 1's held task, batch 2 runs after the loss.
    job = make_job(own_broker.bootstrap_servers, tmp_path, seed=13, messages=1500, spark=cluster)
    job.arm()
    run = DriverRun(job.toml)
    marker = wait_for_marker(job, run)
    executor = next(
        p for p in psutil.Process(marker.pid).parents() if "CoarseGrainedExecutorBackend"
        in " ".join(p.cmdline())
    )  # fmt: skip
    assert executor in jvm_descendants(run), "the executor is not this driver's"
    executor.kill()
    job.disarm()
    rc = run.wait()
    outcome, what = "continued", "the batch's tasks ran again on the other executor"
    if rc != 0:
        outcome, what = "named error", f"run ended: {run.error_line()!r}; the next run resumed"
        finish(job.toml)
    ok, check = exact_check(job)
    record_and_assert(
        matrix, ok, f"{what}; {check}", group="process",
        fault="kill -9 of an executor JVM mid-task (local-cluster)", times=1, outcome=outcome,
    )  # fmt: skip


def _signal_at_next_manifest(job: Job, run: DriverRun, signals: Iterable[int]) -> str:
    """Send ``signals`` the moment the next batch's manifest (the commit point) appears."""
    before = job.manifests()
    batch = wait_until(lambda: sorted(job.manifests() - before), run, "commit", RUN_TIMEOUT)[0]
    for signum in signals:
        run.signal(signum)
        time.sleep(0.01)  # two signals sent at once arrive as one
    done = (job.output / "_inorder" / "commits" / f"{batch:020d}.done").exists()
    return f"batch {batch}'s commit {'already done' if done else 'publishing'} at the signal"


def test_sigterm_during_a_commit(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    job = make_job(own_broker.bootstrap_servers, tmp_path, seed=14, max_offsets=300)
    # Once: the run finishes the batch it is committing and stops cleanly.
    run = DriverRun(job.toml)
    moment = _signal_at_next_manifest(job, run, [signal.SIGTERM])
    rc = run.wait()
    out = "".join(run.stderr) + json.dumps(run.events)
    clean = rc == 0 and "stopping after the current batch" in out and "Traceback" not in out
    committed = job.committed()
    stopped_early = committed and max(job.manifests()) == committed[-1]
    # Twice: the second signal forces the stop in the middle of the commit.
    forced = DriverRun(job.toml)
    forced_moment = _signal_at_next_manifest(job, forced, [signal.SIGTERM, signal.SIGTERM])
    forced_rc = forced.wait()
    forced_line = forced.error_line()
    final = finish(job.toml)
    ok, check = exact_check(job)
    assert final.records() > 0, "the forced stop must land before the end"
    record_and_assert(
        matrix, ok and clean and bool(stopped_early),
        f"{moment}; stopped cleanly (exit {rc}) with every manifest done; next run resumed; "
        f"{check}",
        group="process", fault="SIGTERM during a commit", times=1, outcome="continued",
    )  # fmt: skip
    record_and_assert(
        matrix, ok and forced_rc in (0, 130),
        f"{forced_moment}; exit {forced_rc} ({forced_line!r}); next run resumed; {check}",
        group="process", fault="SIGTERM twice (forced stop) during a commit", times=1,
        outcome="continued",
    )  # fmt: skip


@pytest.mark.slow
def test_crash_loop_within_one_batch(
    own_broker: OwnBroker, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    job = make_job(own_broker.bootstrap_servers, tmp_path, seed=15, max_offsets=1500)
    rng = random.Random(15)
    job.arm()
    kills = 0
    # Sized by what it proves, not by time: the first kill leaves an attempt's residue (staged
    # files, state files named by the attempt, a held lease, cache slots of dead workers); the
    # second attempt must take over beside it; the third, and the run that finishes, beside
    # the residue of several dead attempts at once. More kills repeat those cases (11 before:
    # 2.6 minutes; 4 before: 1 minute).
    for _ in range(3):
        run = DriverRun(job.toml)
        # Kill -9 right after batch 1 starts (a task of it holds for HOLD seconds).
        count = sum(m.batch_id == 1 for m in markers(job.marker_dir))
        wait_until(
            lambda: sum(m.batch_id == 1 for m in markers(job.marker_dir)) > count,  # noqa: B023
            run,
            "marked task of batch 1",
            RUN_TIMEOUT,
        )
        time.sleep(rng.uniform(0, HOLD / 2))
        run.kill_9()
        run.wait()
        kills += 1
        assert 1 not in job.manifests(), "batch 1 committed during the crash loop"
    job.disarm()
    finish(job.toml)
    ok, check = exact_check(job)
    record_and_assert(
        matrix, ok, f"batch 1 never committed during the loop; next run finished; {check}",
        group="process", fault="crash loop: kill -9 right after batch 1 starts, in a row",
        times=kills, outcome="continued",
    )  # fmt: skip
