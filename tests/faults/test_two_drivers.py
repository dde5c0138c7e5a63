"""Two drivers on one checkpoint: one holds the owner lease, the other is refused or fenced.

The lease primitive (:mod:`inorder.checkpoint.lease`) is raced by many starters at once, on
local disk (processes) and on the S3 server (threads): exactly one wins every round. A holder
that stops renewing is taken over once its lease expires and is then fenced: its commit check
fails with :class:`LeaseLost`. Real ``inorder run`` drivers: a second copy is refused while the
first runs; a paused first driver whose lease was taken stops with a named error and commits
nothing more; after ``kill -9`` the next run takes over (at once: the kernel freed the dead
driver's local run lock), and the output is exact.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.lease import (
    LEASE_FILE,
    CheckpointLease,
    LeaseHeld,
    LeaseLost,
    LeaseStore,
    LocalLeaseStore,
    S3LeaseStore,
)
from inorder.commands.run import dump_toml
from inorder.dev.simulator import simulate
from inorder.sessions.rebuild import read_changes
from inorder.storage.fs import resolve
from tests.faults.test_process_faults import verified
from tests.fixtures.lease_racer import start_in_process
from tests.fixtures.sessions_job import (
    TWO_LOCAL_CORES,
    assert_matches_truth,
    run_command,
    sessions_config,
    spark_child_env,
    two_partition_simulation,
)

STARTERS = 20


def _race_local(directory: str) -> list[tuple[str, int]]:
    # Not fork: this process may hold threads (a SparkSession's, the Kafka clients', pyarrow's)
    # and a forked child can block for ever on a lock one of them held, and the test process
    # then waits for it at exit. The fork server is a fresh interpreter that imported only the
    # racer; each starter forks from it.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.fixtures.lease_racer"])
    barrier = context.Barrier(STARTERS)
    results = context.Queue()
    procs = [
        context.Process(target=start_in_process, args=(directory, barrier, results))
        for _ in range(STARTERS)
    ]
    for proc in procs:
        proc.start()
    outcome = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    return outcome


def _race_threads(make_store: Any) -> list[tuple[str, int]]:
    barrier = threading.Barrier(STARTERS)
    outcome: list[tuple[str, int]] = []
    lock = threading.Lock()

    def start() -> None:
        lease = CheckpointLease(make_store(), 30.0)
        barrier.wait()
        try:
            result = ("won", lease.acquire(wait=False).epoch)
        except LeaseHeld:
            result = ("held", 0)
        with lock:
            outcome.append(result)

    threads = [threading.Thread(target=start) for _ in range(STARTERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcome


def _expire(store: LeaseStore) -> None:
    """Mark the current lease expired, as a holder that died long ago leaves it."""
    found = store.read()
    assert found is not None
    text = re.sub(rb'"expires_at": [0-9.e+]+', b'"expires_at": 1.0', found[0])
    store.swap(found[1], text)


def _check_rounds(rounds: list[list[tuple[str, int]]]) -> None:
    for number, outcome in enumerate(rounds, start=1):
        winners = [epoch for result, epoch in outcome if result == "won"]
        assert len(outcome) == STARTERS
        # Exactly one starter holds the lease, with the next epoch: never two owners.
        assert winners == [number], f"round {number}: winners {winners}"


@pytest.mark.parametrize("rounds", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_concurrent_starts_on_local_lease(tmp_path: Path, matrix: Any, rounds: int) -> None:
    directory = str(tmp_path / "checkpoint")
    results = []
    for _ in range(rounds):
        results.append(_race_local(directory))
        _expire(LocalLeaseStore(directory))  # the next round races for an expired lease
    _check_rounds(results)
    matrix.record(
        group="two drivers",
        fault=f"{STARTERS} processes start on one local checkpoint at once",
        times=rounds,
        outcome="refused",
        check=f"exactly one owner per round, epochs 1..{rounds}; {STARTERS - 1} refused",
        ok=True,
    )


# Three rounds: each a race of every starter for a fresh or an expired lease. More rounds on
# S3 repeat the same conditional PUTs at about 5 s each on the local server (10: a minute).
@pytest.mark.parametrize("rounds", [3])
def test_concurrent_starts_on_s3_lease(s3: Any, matrix: Any, rounds: int) -> None:
    location = resolve(s3.new_prefix() + "/checkpoint", s3.storage_options())
    path = location.join(LEASE_FILE)
    assert location.s3 is not None
    settings = location.s3
    results = []
    for _ in range(rounds):
        results.append(_race_threads(lambda: S3LeaseStore(settings, path)))
        _expire(S3LeaseStore(settings, path))
    _check_rounds(results)
    matrix.record(
        group="two drivers",
        fault=f"{STARTERS} starters on one S3 checkpoint at once (If-None-Match / If-Match)",
        times=rounds,
        outcome="refused",
        check=f"exactly one owner per round, epochs 1..{rounds}; {STARTERS - 1} refused",
        ok=True,
    )


@pytest.mark.parametrize("where", ["local", "s3"])
def test_live_holder_refuses_dead_holder_is_taken_over_and_fenced(
    request: pytest.FixtureRequest, tmp_path: Path, matrix: Any, where: str
) -> None:
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        layout = CheckpointLayout(s3.new_prefix() + "/checkpoint")
        object.__setattr__(layout, "location", resolve(layout.root, s3.storage_options()))
    else:
        layout = CheckpointLayout(str(tmp_path / "checkpoint"))
    first = layout.lease(1.5)
    assert first.acquire().epoch == 1
    first.start_renewing()
    started = time.monotonic()
    with pytest.raises(LeaseHeld, match="is held by another run"):
        layout.lease(1.5).acquire()  # watches it renewed: alive, refused
    # Refused on seeing the lease renewed, not after waiting for it to expire many times
    # over (a generous bound: renewals are slower on a busy machine).
    assert time.monotonic() - started < 10
    # The holder stops renewing (paused, cut off): the next start waits for the expiry.
    first._stop.set()
    assert first._thread is not None
    first._thread.join()
    second = layout.lease(1.5)
    assert second.acquire().epoch == 2
    with pytest.raises(LeaseLost, match=r"lost checkpoint lease .* \(its epoch 1\)"):
        first.check(7)  # the fencing check before a commit: the old holder commits nothing
    first.release()  # must not disturb the new holder
    second.check(8)
    second.release()
    assert layout.lease(1.5).acquire(wait=False).epoch == 3  # released: no wait
    matrix.record(
        group="two drivers",
        fault=f"second start beside a live holder; holder stops renewing ({where} lease)",
        times=1,
        outcome="refused",
        check="live holder: LeaseHeld; expired: taken over at epoch 2; old holder's commit "
        "check: LeaseLost",
        ok=True,
    )


def _wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _spark_batches(checkpoint: Path, log: str) -> list[int]:
    folder = checkpoint / "spark" / log
    return sorted(int(p.name) for p in folder.glob("*") if p.name.isdigit())


def _caught_up(checkpoint: Path) -> bool:
    planned, done = _spark_batches(checkpoint, "offsets"), _spark_batches(checkpoint, "commits")
    return bool(planned) and planned == done


def _start(toml: Path, tmp: Path, name: str, *flags: str) -> subprocess.Popen[str]:
    out = (tmp / f"{name}.out").open("w")
    return subprocess.Popen(
        run_command(toml, *flags),
        env=spark_child_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: the driver and its JVM are signalled together
    )


def _stop_group(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def test_real_drivers_refused_fenced_and_taken_over(
    kafka: Any, tmp_path: Path, matrix: Any
) -> None:
    prefix = f"lease-{random.randrange(10**9)}-"
    first_truth = simulate(
        two_partition_simulation(
            prefix + "a", 21, sessions_per_site=3, rows_per_snapshot=4, messages=1200
        ),
        kafka.bootstrap_servers,
    ).ground_truth
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        max_offsets=400,
        trigger="1 second",
        progress="plain",
        discovery_interval="1 second",
        spark=TWO_LOCAL_CORES,
    )
    config["pipeline"]["lease_duration"] = "3 seconds"
    toml = tmp_path / "p.toml"
    toml.write_text(dump_toml(config))
    checkpoint = tmp_path / "checkpoint"
    runs: list[subprocess.Popen[str]] = []
    try:
        # 1. A second copy while the first runs is refused at once, before Spark starts.
        first = _start(toml, tmp_path, "first")
        runs.append(first)
        _wait_for(lambda: _caught_up(checkpoint), 240, "the first run to catch up")
        second = subprocess.run(
            [*run_command(toml), "--trigger", "available-now"],
            env=spark_child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        refusal = second.stderr.strip().splitlines()[-1]
        assert second.returncode == 2, second.stderr
        assert re.fullmatch(
            rf"inorder: error: checkpoint {re.escape(str(checkpoint))} is in use by another run "
            rf"\(pid {first.pid} on \S+ since \S+\); stop that copy first, or give this one "
            r"its own pipeline\.checkpoint",
            refusal,
        ), refusal
        matrix.record(
            group="two drivers",
            fault="second `inorder run` on a running pipeline's local checkpoint",
            times=1,
            outcome="refused",
            check=refusal,
            ok=True,
        )

        # 2. The first driver is paused past its lease; another driver takes the lease (the
        # test, as a driver on another machine would); new data arrives; the first resumes.
        os.killpg(first.pid, signal.SIGSTOP)
        committed_before = _spark_batches(checkpoint, "commits")
        planned_before = _spark_batches(checkpoint, "offsets")
        time.sleep(3.5)
        thief = CheckpointLease(LocalLeaseStore(str(checkpoint)), 3.0, holder="a driver elsewhere")
        assert thief.acquire(wait=False).epoch == 2
        later_truth = simulate(
            two_partition_simulation(
                prefix + "b", 22, sessions_per_site=2, rows_per_snapshot=4, messages=600
            ),
            kafka.bootstrap_servers,
        ).ground_truth
        os.killpg(first.pid, signal.SIGCONT)
        first.wait(timeout=120)
        output = (tmp_path / "first.out").read_text()
        lost = [line for line in output.splitlines() if "lost checkpoint lease" in line]
        assert first.returncode == 1, output[-3000:]
        assert lost and re.fullmatch(
            r"inorder: error: this run lost checkpoint lease \S+ \(its epoch 1\) to a driver "
            r"elsewhere, lease epoch 2 valid until \S+; this run stopped and commits nothing "
            r"more \(the other run goes on\)",
            lost[-1],
        ), output[-3000:]
        # A batch whose fencing check passed before the pause may still finish its commit (the
        # documented window: the check extends the lease for that commit); nothing planned
        # after the pause, and nothing after the lost check, is committed.
        committed_after = _spark_batches(checkpoint, "commits")
        assert set(committed_after) <= set(planned_before), (planned_before, committed_after)
        committed_before = committed_after
        assert not any(
            t.startswith(prefix + "b")
            for t in read_changes(str(tmp_path / "output")).column("topic").to_pylist()
        )
        matrix.record(
            group="two drivers",
            fault="driver paused (SIGSTOP) past its lease, lease taken, new data, resumed",
            times=1,
            outcome="named error",
            check=lost[-1],
            ok=True,
        )

        # 3. kill -9 of a driver: the next run waits for its lease to expire, then takes over.
        third = _start(toml, tmp_path, "third")  # takes the thief's lease once it expires
        runs.append(third)
        _wait_for(
            lambda: (
                "took over the checkpoint lease of a driver elsewhere"
                in (tmp_path / "third.out").read_text()
            ),
            120,
            "the takeover of an expired lease",
        )
        _wait_for(
            lambda: _spark_batches(checkpoint, "commits") != committed_before,
            240,
            "the third run to commit",
        )
        _stop_group(third)
        started = time.monotonic()
        last = subprocess.run(
            [*run_command(toml), "--trigger", "available-now"],
            env=spark_child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert last.returncode == 0, last.stderr[-3000:]
        took_over = f"took over the checkpoint lease of pid {third.pid} on "
        assert took_over in last.stderr, last.stderr[-3000:]
        took_over = next(line for line in last.stderr.splitlines() if took_over in line)
        changes = read_changes(str(tmp_path / "output"))
        topics = changes.column("topic").to_pylist()
        mask_a = [t.startswith(prefix + "a") for t in topics]
        assert_matches_truth(changes.filter(mask_a), first_truth)
        assert_matches_truth(changes.filter([not m for m in mask_a]), later_truth)
        proof_ok, proof = verified(toml)
        matrix.record(
            group="two drivers",
            fault="kill -9 of the lease holder, next run started at once",
            times=1,
            outcome="continued",
            check=f"{took_over} ({time.monotonic() - started:.0f} s run: the freed run lock "
            f"proves the holder gone, no wait); exact: 0 missing, 0 extra, 0 duplicated; {proof}",
            ok=proof_ok,
        )
        assert proof_ok, proof
    finally:
        for run in runs:
            _stop_group(run)
