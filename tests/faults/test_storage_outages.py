"""Fault matrix, storage outages: the S3 server stops or errs mid-batch; the local disk fills.

Each case runs the session-table job (``tests/fixtures/sessions_job.py``) as ``inorder run``
subprocesses on a broker of this module's own (fixed topic names, a prefix per case: the same
partitions on every run) and, for S3 output, a SeaweedFS server: one of its own where the case
stops it, else one the module's cases share. The job's S3 endpoint is a fault-injecting proxy
(``tests/faults/s3_proxy.py``) in front of that server, so each fault lands at a known
request: the first staged data file of a batch, a Parquet manifest, a Delta log entry. Where
the server is stopped, the proxy goes down at that request (clients see refused connections
from then on), the real server is stopped by pid, kept down, and restarted on the same data
directory and ports. The run either continues or stops with one named line; a later run must
leave the output exact against the simulator's truth and ``inorder validate``.

The checkpoint stays on local disk: Spark's offsets and commits logs need a Hadoop
filesystem, and s3a is not available (``docs/operations-guide.md``). Disk-full cases mount a
small tmpfs (root only) where one writer writes: Spark's offsets log, Spark's commits log,
inorder's state folder or the local output. A gate in the processor holds a batch's tasks (its
offsets are written, nothing of it is committed); the test fills the tmpfs to the last byte,
then opens the gate, so the writer that meets the full disk first is known, not a race.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inorder.checkpoint.names import ENGINE_DIR, RUN_LOG_FILE, SPARK_DIR
from inorder.commands.run import dump_toml
from inorder.dev import servers, services
from inorder.dev.simulator import GroundTruth, simulate
from inorder.endpoints import S3Settings, kafka_bootstrap_servers, read_services_file
from inorder.sessions import SessionTables
from inorder.sessions.rebuild import read_changes
from tests.faults.conftest import MatrixRecorder
from tests.faults.s3_proxy import Moment, S3Proxy
from tests.faults.test_process_faults import (
    RUN_TIMEOUT,
    DriverRun,
    exact_verdict,
    finish,
    wait_until,
)
from tests.fixtures.sessions_job import (
    RESTART_SESSION,
    TWO_LOCAL_CORES,
    sessions_config,
    two_partition_simulation,
)

#: How long the S3 server stays stopped (seconds), on top of stopping and starting it.
DOWN_SECONDS = 3.0
#: The backlog of the S3 cases: three batches. Their faults land in the first batch or at the
#: first commit, and two batches after it show the run (or the next one) going on; each batch
#: more only added a second or two to every run that read it.
S3_MESSAGES = 900
#: The first request writing a data file of a batch, per sink format.
STAGED = {
    "parquet": r"^(PUT|POST) /[^?]*/_inorder/staging/\d+/",
    "delta": r"^(PUT|POST) /[^?]*/topic(=|%3D)[^/?]+/part-\d+-",
}
#: The request that commits a batch, per format, and the moment the outage starts there:
#: a Parquet manifest is created and acknowledged, then publication meets the outage; a Delta
#: log entry never reaches the server.
COMMIT = {
    "parquet": (r"^PUT /[^?]*/_inorder/commits/\d{20}\.json", "after"),
    "delta": (r"^PUT /[^?]*/_delta_log/\d{20}\.json", "before"),
}


# -- the services of one test -----------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh broker on a free port for this module only; its bootstrap servers.

    No case here stops it, and each reads topics of its own prefix: starting one per case
    only cost time.
    """
    state_dir = tmp_path_factory.mktemp("broker")
    services.up(state_dir, kafka_port=0, only=["kafka"], die_with_parent=True)
    try:
        yield kafka_bootstrap_servers(state_dir)
    finally:
        services.down(state_dir, only=["kafka"])


@dataclasses.dataclass
class OwnS3:
    """A SeaweedFS server this test started, behind a fault-injecting proxy."""

    state_dir: Path
    settings: S3Settings
    proxy: S3Proxy

    def storage_options(self) -> dict[str, str]:
        """The store as the job sees it: through the proxy."""
        return dataclasses.replace(
            self.settings, endpoint_url=self.proxy.endpoint_url
        ).storage_options()

    def stop(self) -> None:
        services.down(self.state_dir, only=["s3"])

    def start(self) -> None:
        """On the data directory, credentials and every port of the first start."""
        services.up(self.state_dir, only=["s3"], die_with_parent=True)

    def outage(self, seconds: float = DOWN_SECONDS) -> None:
        """Stop the server by pid, keep it down ``seconds``, start it again (proxy still down)."""
        self.stop()
        time.sleep(seconds)
        self.start()


def _s3_settings(state_dir: Path) -> S3Settings:
    entry = read_services_file(state_dir)["s3"]
    return S3Settings(
        entry["endpoint_url"], entry["access_key_id"], entry["secret_access_key"],
        entry["region"], entry["bucket"],
    )  # fmt: skip


@contextlib.contextmanager
def _proxied(state_dir: Path, tmp_path: Path) -> Iterator[OwnS3]:
    """The server of ``state_dir`` behind a proxy of this test's own."""
    proxy = S3Proxy(int(read_services_file(state_dir)["s3"]["port"]))
    try:
        yield OwnS3(state_dir, _s3_settings(state_dir), proxy)
    finally:
        proxy.close()
        (tmp_path / "s3-requests.log").write_text("\n".join(proxy.seen))  # for a failure


@pytest.fixture
def own_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OwnS3]:
    """A SeaweedFS server on free ports in this test's directory, and its proxy."""
    state_dir = tmp_path / "s3"
    services.up(state_dir, s3_port=0, only=["s3"], die_with_parent=True)
    try:
        # A restart reuses the S3 port (services.json); keep the internal ports too.
        ports = dict(read_services_file(state_dir)["s3"]["internal_ports"])
        monkeypatch.setattr(servers, "_internal_s3_ports", lambda port: ports)
        with _proxied(state_dir, tmp_path) as own:
            yield own
    finally:
        services.down(state_dir, only=["s3"])


@pytest.fixture(scope="module")
def module_s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A SeaweedFS server for the cases that never stop it (its state directory).

    Their faults are all injected by a proxy of each case's own in front of it, and each
    writes under a name of its own, so one server serves them all: a server's start and
    graceful stop per case cost about 3 s and showed nothing.
    """
    state_dir = tmp_path_factory.mktemp("s3")
    services.up(state_dir, s3_port=0, only=["s3"], die_with_parent=True)
    try:
        yield state_dir
    finally:
        services.down(state_dir, only=["s3"])


@pytest.fixture
def proxied_s3(module_s3_server: Path, tmp_path: Path) -> Iterator[OwnS3]:
    """The module's SeaweedFS server behind a fresh proxy of this test's own (never stopped)."""
    with _proxied(module_s3_server, tmp_path) as own:
        yield own


# -- the job and its check --------------------------------------------------------------------


@dataclasses.dataclass
class Job:
    toml: Path
    output: str
    options: dict[str, str] | None
    truth: GroundTruth


def make_job(
    bootstrap: str,
    work: Path,
    prefix: str,
    seed: int,
    sink: dict[str, Any] | None = None,
    processor: dict[str, Any] | None = None,
    messages: int = 1500,
) -> Job:
    """Two sites of two partitions each, 300 records a batch (``messages`` / 300 batches).

    Every fault lands in the first batch, at a batch's commit or in batch ``FULL_AT``; the
    batches after it show the run (or the next one) going on from there.
    """
    simulation = two_partition_simulation(
        prefix, seed, sites=2, faulty=0.2, sessions_per_site=8, rows_per_snapshot=5,
        messages=messages, restart_every=120,
    )  # fmt: skip
    result = simulate(simulation, bootstrap)
    sink = sink or {"path": str(work / "output"), "partition_by": ["topic"]}
    sections = {"processor": processor} if processor else {}
    config = sessions_config(
        bootstrap, prefix, work, name="outages", max_offsets=300, trigger="available-now",
        progress="json", integrity=RESTART_SESSION, sink=sink, spark=TWO_LOCAL_CORES,
        **sections,
    )  # fmt: skip
    # The simulated faults set records aside by design (exit 3 by default): these tests look
    # at whether a run continued (0) or stopped with a named error (1), not at that.
    config["pipeline"]["set_aside_exit_code"] = 0
    toml = work / "pipeline.toml"
    toml.write_text(dump_toml(config))
    return Job(toml, sink["path"], sink.get("storage_options"), result.ground_truth)


def s3_sink(s3: OwnS3, fmt: str, name: str) -> dict[str, Any]:
    return {
        "type": fmt,
        "path": f"s3://{s3.settings.bucket}/{name}/output",
        "partition_by": ["topic"],
        "storage_options": s3.storage_options(),
    }


def exact_check(job: Job) -> tuple[bool, str]:
    """The output against the truth and ``inorder validate``: (exact?, the check in words)."""
    return exact_verdict(
        read_changes(job.output, job.options), job.truth, job.toml, own_process=True
    )


def ended(run: DriverRun, named_by: Callable[[str], bool]) -> tuple[str, str, bool]:
    """(outcome, what happened, as expected?) of a run that met a fault; waits for its end.

    A run that stops must print one ``inorder: error:`` line that ``named_by`` accepts, and
    no Python trace.
    """
    rc = run.wait()
    if rc == 0:
        return "continued", "the run retried through it and finished", True
    line = run.error_line()
    trace = "Traceback" in "".join(run.stderr)
    named = bool(line) and not trace and named_by(line)
    what = f"the run stopped (exit {rc}): {line!r}"
    if not named:
        what = f"DEFECT ({'a Python trace' if trace else 'error not named'}): {what}"
    return "named error", what, named


# -- S3 server stopped and restarted ----------------------------------------------------------


def names_s3_unreachable(line: str) -> bool:
    """The line names the S3 object or bucket and the lost connection.

    The request in flight when the server stops sees its connection reset, later ones a
    refused connection. A request whose body was being sent when the connection was reset
    fails on the send instead (curl: "Send failure: Broken pipe", "Failure when sending data
    to the peer", "Empty reply from server"): the AWS SDK classes all of these as
    ``NETWORK_CONNECTION``, which inorder's message keeps.
    """
    text = line.lower()
    causes = (
        "refused",
        "could not connect",
        "connection reset",
        "network_connection",
        "broken pipe",
        "empty reply",
    )
    return ("s3://" in text or "bucket" in text) and any(c in text for c in causes)


@pytest.mark.parametrize("fmt", ["parquet", pytest.param("delta", marks=pytest.mark.slow)])
def test_s3_server_stopped_mid_batch(
    fmt: str, broker: str, own_s3: OwnS3, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    sink = s3_sink(own_s3, fmt, f"stopped-{fmt}")
    job = make_job(broker, tmp_path, f"so{fmt[0]}-", 21, sink, messages=S3_MESSAGES)
    proxy = own_s3.proxy
    commit = (
        "right after a Parquet batch's manifest (the commit point), during publication"
        if fmt == "parquet"
        else "at a Delta batch's commit (the log entry's PUT)"
    )
    phases: list[tuple[str, str, Moment]] = [
        (f"while staging a {fmt} batch's data files", STAGED[fmt], "before"),
        (commit, *COMMIT[fmt]),
    ]
    results: list[tuple[str, str, bool]] = []
    down = proxy.trip(phases[0][1], phases[0][2])
    run = DriverRun(job.toml)
    for n in range(len(phases)):
        last = n + 1 == len(phases)
        wait_until(down.is_set, run, f"the request of outage {n + 1}", RUN_TIMEOUT)
        own_s3.outage()
        if not last:  # armed while the proxy is still down: nothing passes in between
            down = proxy.trip(phases[n + 1][1], phases[n + 1][2])
        proxy.up()
        if not last:
            wait_until(lambda: down.is_set() or not run.alive(), None, "an end", RUN_TIMEOUT)  # noqa: B023
            if run.alive():
                results.append(("continued", "the run retried through it", True))
                continue
        results.append(ended(run, names_s3_unreachable))
        if not last:
            run = DriverRun(job.toml)
    final = finish(job.toml)
    ok, check = exact_check(job)
    for (moment, _, _), (outcome, what, named) in zip(phases, results, strict=True):
        matrix.record(
            group="storage",
            fault=f"S3 server stopped {DOWN_SECONDS:.0f} s {moment}, restarted (same data "
            "dir and ports)",
            times=1, outcome=outcome, ok=ok and named,
            check=f"{what}; the next run resumed ({final.records()} records); {check}",
        )  # fmt: skip
    assert ok, check
    assert all(named for _, _, named in results), "\n".join(what for _, what, _ in results)


# -- S3 answering errors for a while ----------------------------------------------------------


def names_s3(line: str) -> bool:
    """The line names the S3 object or bucket that failed."""
    return "s3://" in line or "bucket" in line.lower()


ERRORS = {
    "503 SlowDown to 12 requests in a row from a batch's first staged write": (
        "parquet",
        lambda proxy: proxy.on(STAGED["parquet"], lambda: proxy.errors(count=12)),
    ),
    "connections reset for 3 s from a batch's first staged write": (
        "parquet",
        lambda proxy: proxy.on(STAGED["parquet"], lambda: proxy.errors(seconds=3, reset=True)),
    ),
    "answer to a Parquet manifest's conditional PUT lost (created; the client retried)": (
        "parquet",
        lambda proxy: proxy.lose_answer(COMMIT["parquet"][0]),
    ),
    "answer to a Delta log entry's conditional PUT lost (created; the client retried)": (
        "delta",
        lambda proxy: proxy.lose_answer(COMMIT["delta"][0]),
    ),
}
SLOW_ERRORS = {"connections reset for 3 s from a batch's first staged write"}


@pytest.mark.parametrize(
    "fault",
    [pytest.param(f, marks=[pytest.mark.slow] if f in SLOW_ERRORS else []) for f in ERRORS],
)
def test_s3_errors_for_a_while(
    fault: str, broker: str, proxied_s3: OwnS3, tmp_path: Path, matrix: MatrixRecorder
) -> None:
    fmt, arm = ERRORS[fault]
    number = list(ERRORS).index(fault)
    name = f"errors-{number}"
    sink = s3_sink(proxied_s3, fmt, name)
    job = make_job(broker, tmp_path, f"se{number}-", 22, sink, messages=S3_MESSAGES)
    arm(proxied_s3.proxy)
    run = DriverRun(job.toml)
    outcome, what, named = ended(run, names_s3)
    proxied_s3.proxy.errors()  # what is left of a burst ends with the run
    injected = proxied_s3.proxy.injected
    assert injected, f"the fault was never injected: {proxied_s3.proxy.seen[-20:]}"
    if outcome != "continued":
        finish(job.toml)
        what += "; the next run resumed"
    ok, check = exact_check(job)
    matrix.record(
        group="storage", fault=f"S3 {fault} ({fmt} output)", times=injected, outcome=outcome,
        ok=ok and named, check=f"{what}; {check}",
    )  # fmt: skip
    assert ok, check
    assert named, what


# -- local disk full --------------------------------------------------------------------------

#: The batch whose tasks are held while the tmpfs is filled: batches 0 and 1 are done by then.
FULL_AT = 2
#: Per writer: where its tmpfs is mounted (under the test's folder), what meets the full disk
#: first once the held batch goes on, and Spark's logs at the stop (the last offsets and
#: commits files), the proof of where the run stopped.
DISK_FULL: dict[str, tuple[str, str, tuple[int, int]]] = {
    "offsets": (
        f"checkpoint/{SPARK_DIR}/offsets",
        f"Spark's offsets log (batch {FULL_AT + 1}'s offsets file, after batch {FULL_AT} "
        "committed)",
        (FULL_AT, FULL_AT),
    ),
    "commits": (
        f"checkpoint/{SPARK_DIR}/commits",
        f"Spark's commits log (batch {FULL_AT}'s commit file, after its output and state)",
        (FULL_AT, FULL_AT - 1),
    ),
    "state": (
        f"checkpoint/{ENGINE_DIR}",
        f"inorder's state write (batch {FULL_AT}'s state files, in its tasks)",
        (FULL_AT, FULL_AT - 1),
    ),
    "output": (
        "output",
        f"the local output's staging (batch {FULL_AT}'s staged files, in its tasks)",
        (FULL_AT, FULL_AT - 1),
    ),
}
GATED = f"{__name__}:GatedSessions"
#: Batches this worker process has seen (the gate is looked at once per batch, not per record).
_SEEN: set[int] = set()


class GatedSessions(SessionTables):
    """The session processor; the batch named in ``gate_dir/hold`` waits for ``gate_dir/release``.

    The first record of that batch in a worker process writes ``gate_dir/held-<pid>`` and
    waits until ``release`` exists: the batch's offsets are written by then, its state, output
    and commit are not. Its output is the session processor's, record for record.
    """

    def __init__(self, gate_dir: str = "", *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.gate_dir = gate_dir

    def __reduce__(self) -> tuple[Any, ...]:
        return (_gated_sessions, (self.gate_dir, super().__reduce__()[1]))

    def process(self, state: Any, msg: Any, ctx: Any) -> Any:
        if self.gate_dir and ctx.batch_id not in _SEEN:
            _SEEN.add(ctx.batch_id)
            Gate(Path(self.gate_dir)).pass_through(ctx.batch_id)
        return super().process(state, msg, ctx)


def _gated_sessions(gate_dir: str, args: tuple[Any, ...]) -> GatedSessions:
    return GatedSessions(gate_dir, *args)


@dataclasses.dataclass(frozen=True)
class Gate:
    """Files shared by the test and the gated processor in Spark's Python workers."""

    folder: Path

    def hold(self, batch: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "hold").write_text(str(batch))

    def release(self) -> None:
        (self.folder / "release").write_text("")

    def held(self) -> list[Path]:
        return sorted(self.folder.glob("held-*"))

    def pass_through(self, batch: int) -> None:
        """In a worker: wait for the release if ``batch`` is the one to hold."""
        hold = self.folder / "hold"
        if not hold.exists() or int(hold.read_text()) != batch:
            return
        (self.folder / f"held-{os.getpid()}").write_text(str(batch))
        # Bounded like a run: a test that died must not leave a worker waiting forever.
        deadline = time.monotonic() + RUN_TIMEOUT
        while not (self.folder / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)


@contextlib.contextmanager
def small_tmpfs(directory: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``directory`` (skips unless root and mount works)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    directory.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)]
    done = subprocess.run(mount, capture_output=True, text=True, timeout=30)
    if done.returncode:
        pytest.skip(f"mount -t tmpfs failed: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        if subprocess.run(["umount", str(directory)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(directory)], check=True)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte with one file; its path."""
    filler = directory / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler


def names_no_space(directory: Path) -> Callable[[str], bool]:
    """The line names the full filesystem's folder (or a file in it) and the lack of space."""

    def named(line: str) -> bool:
        message = line.split(" (full trace in ")[0]
        text = message.lower()
        no_space = "no space left" in text or "enospc" in text or "errno 28" in text
        return no_space and "not committed" in text and str(directory) in message

    return named


def spark_logs(checkpoint: Path) -> tuple[int, int]:
    """The last batch id of Spark's offsets log and of its commits log (-1: none)."""

    def last(folder: str) -> int:
        ids = [int(p.name) for p in (checkpoint / SPARK_DIR / folder).glob("*") if p.name.isdigit()]
        return max(ids, default=-1)

    return last("offsets"), last("commits")


@pytest.mark.parametrize(
    "writer",
    ["offsets", "commits", "state", pytest.param("output", marks=pytest.mark.slow)],
)
def test_local_disk_full(writer: str, broker: str, tmp_path: Path, matrix: MatrixRecorder) -> None:
    folder, first_writer, expected_logs = DISK_FULL[writer]
    checkpoint = tmp_path / "checkpoint"
    with small_tmpfs(tmp_path / folder) as directory:
        gate = Gate(tmp_path / "gate")
        prefix = {"offsets": "sdf-", "commits": "sdc-", "state": "sds-", "output": "sdo-"}
        job = make_job(
            broker, tmp_path, prefix[writer], 23,
            processor={"type": GATED, "options": {"gate_dir": str(gate.folder)}},
        )  # fmt: skip
        gate.hold(FULL_AT)
        run = DriverRun(job.toml)
        wait_until(gate.held, run, f"batch {FULL_AT}'s tasks held", RUN_TIMEOUT)
        filler = fill(directory)
        gate.release()
        outcome, what, named = ended(run, names_no_space(directory))
        logs = spark_logs(checkpoint)
        with contextlib.suppress(OSError):  # the rerun replaces it: keep the trace
            shutil.copyfile(checkpoint / RUN_LOG_FILE, tmp_path / "failed-run.log")
        filler.unlink()
        what += (
            f"; Spark's logs at the stop: offsets through batch {logs[0]}, commits through "
            f"{logs[1]}; space freed, the next run resumed"
        )
        finish(job.toml)
        ok, check = exact_check(job)
    matrix.record(
        group="storage",
        fault=f"local disk full (8 MiB tmpfs on {folder}, filled while batch {FULL_AT}'s "
        f"tasks were held): met first by {first_writer}",
        times=1, outcome=outcome, ok=ok and named and logs == expected_logs,
        check=f"{what}; {check}",
    )  # fmt: skip
    assert ok, check
    assert named, what
    assert logs == expected_logs, f"the full disk was met elsewhere than {first_writer}: {what}"
