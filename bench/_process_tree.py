"""Measuring a benchmark's process tree: CPU seconds of every process, resident memory."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _tree_processes(pid: int) -> list[Any]:
    """``pid`` and its live descendants as psutil processes (empty when it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def rss_tree(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (psutil, else /proc)."""
    try:
        import psutil
    except ImportError:
        return _rss_tree_proc(pid)
    total = 0
    for p in _tree_processes(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total


def _rss_tree_proc(pid: int) -> int:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        stack.extend(children.get(p, []))
        with contextlib.suppress(OSError, IndexError, ValueError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


# -- CPU of a process tree -----------------------------------------------------------------


def set_child_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``prctl``).

    A process whose parent exits first (a Spark JVM left behind by its Python driver, a
    worker left by the JVM) is then handed to this process instead of to init, so it stays
    in this process's tree, is still sampled, and its CPU time reaches this process's
    ``RUSAGE_CHILDREN`` when it is reaped. False where that is not available.
    """
    if sys.platform != "linux":
        return False
    import ctypes

    pr_set_child_subreaper = 36
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def broker_pid(tmp: str, bootstrap: str) -> int | None:
    """The pid of the broker :func:`broker` started in ``tmp`` (else the one on its port)."""
    from inorder.endpoints import read_services_file

    with contextlib.suppress(Exception):
        entry = read_services_file(Path(tmp) / "kafka").get("kafka")
        if isinstance(entry, dict) and entry.get("pid"):
            return int(entry["pid"])
    import psutil

    port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return int(conn.pid) if conn.pid else None
    return None


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (0 when it is gone)."""
    import psutil

    total = 0.0
    for p in _tree_processes(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def wait_idle(pid: int, *, below: float = 0.05, window: float = 1.0, limit: float = 60.0) -> float:
    """Wait until ``pid``'s tree uses less than ``below`` of a core over ``window`` seconds
    (at most ``limit`` seconds); the seconds waited.

    The local broker keeps working for a few seconds after a backlog is produced (about 0.8 s
    of CPU after 200k records, measured): charged to the run that follows, it was a fixed
    cost of whichever contender ran first.
    """
    started = time.monotonic()
    before = tree_cpu_seconds(pid)
    while time.monotonic() - started < limit:
        time.sleep(window)
        now = tree_cpu_seconds(pid)
        if now - before < below * window:
            break
        before = now
    return time.monotonic() - started


@dataclass
class TreeRun:
    """What :func:`run_tree` saw of one process tree, from its start until its last exit."""

    returncode: int
    #: Seconds from the start to the root process's exit.
    wall: float
    #: Seconds from the start until the last process of the tree was gone.
    tree_wall: float
    #: CPU seconds of every process of the tree: this process's ``RUSAGE_CHILDREN`` delta
    #: after reaping the whole tree (with :func:`set_child_subreaper`) plus ``lost``; else
    #: ``sampled``.
    cpu: float
    #: Sum over the processes seen of their last sampled user + system time (a lower bound:
    #: the last interval before each exit and processes shorter than one interval are missing).
    sampled: float
    #: Sampled seconds of the processes reaped by a parent that ignored SIGCHLD (the kernel
    #: does not add those to anyone's ``RUSAGE_CHILDREN``).
    lost: float
    #: ``sampled`` by role: ``driver``, ``jvm``, ``python -m MODULE``, or the process name.
    by_role: dict[str, float]
    #: Processes seen.
    processes: int
    #: Lines of the root's stdout, each with the seconds since the start it arrived at.
    lines: list[tuple[float, str]]
    #: (seconds since the start, ``sampled`` up to then) at every sample.
    series: list[tuple[float, float]]
    #: The start as a Unix time.
    start_epoch: float
    #: PYTHONPATH of each Python process seen other than the root (``watch_env``).
    python_paths: list[str]
    exact: bool


def _ignores_sigchld(pid: int) -> bool:
    """Whether ``pid`` ignores SIGCHLD (its exited children are then reaped unaccounted)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> 16 & 1)  # SIGCHLD is signal 17
    return False


def cpu_at(series: Sequence[tuple[float, float]], at: float) -> float:
    """CPU seconds of a :attr:`TreeRun.series` at ``at`` seconds (linear between samples)."""
    before = (0.0, 0.0)
    for point in series:
        if point[0] >= at:
            span = point[0] - before[0]
            share = (at - before[0]) / span if span > 0 else 1.0
            return before[1] + share * (point[1] - before[1])
        before = point
    return before[1]


def run_tree(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: str,
    stderr_path: str,
    exclude_pgids: Sequence[int] = (),
    interval: float = 0.2,
    linger: float = 60.0,
) -> TreeRun:
    """Run ``argv`` and measure the CPU of its whole process tree until the last process exits.

    Every ``interval`` seconds the descendants of this process are listed (those in
    ``exclude_pgids`` left out, e.g. a broker this process started) and each one's CPU times
    are kept, so processes that exit on the way are still counted. The tree is over when none
    is left; what still runs ``linger`` seconds after the root exited is terminated (by pid).
    Run one tree at a time: every descendant not excluded is counted as part of it.

    The total: this process's ``RUSAGE_CHILDREN`` delta once the tree is reaped (this process
    is made the reaper of orphans, so every process that its parent waited for is in it, up
    to the end of its life), plus the last sampled times of the processes whose parent
    ignored SIGCHLD (PySpark's worker daemon does: the kernel then drops their times).
    """
    import resource
    import subprocess
    import threading

    import psutil

    me = os.getpid()
    exact = set_child_subreaper()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines: list[tuple[float, str]] = []
    # (pid, start) -> [own seconds, reaped children's seconds, role, parent ignores SIGCHLD]
    last: dict[tuple[int, float], list[Any]] = {}
    ignoring: dict[int, bool] = {}
    reaped: set[tuple[int, float]] = set()
    paths: dict[tuple[int, float], str] = {}
    start_epoch = time.time()
    started = time.perf_counter()
    with open(stderr_path, "ab") as err:
        proc = subprocess.Popen(
            list(argv), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True
        )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - started, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def role(p: Any, known: str | None) -> str:
        if p.pid == proc.pid:
            return "driver"
        name = p.name()
        if "java" in name:
            return "jvm"
        try:
            cmd = p.cmdline()
        except psutil.Error:
            cmd = []
        if not cmd and known:
            return known  # an exiting process or a zombie: no command line left
        if "-m" in cmd[:-1]:
            # PySpark's daemon is started with the worker module it forks for:
            # ``-m pyspark.daemon pyspark.worker`` or a planner's module.
            i = cmd.index("-m")
            return " ".join(["python", *cmd[i : i + 3]])
        return name

    def sample() -> list[Any]:
        try:
            procs = psutil.Process(me).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for p in procs:
            try:
                if exclude_pgids and os.getpgid(p.pid) in exclude_pgids:
                    continue
                key = (p.pid, p.create_time())
                t = p.cpu_times()
                ppid = p.ppid()
                if ppid not in ignoring:
                    ignoring[ppid] = ppid != me and _ignores_sigchld(ppid)
                zombie = p.status() == psutil.STATUS_ZOMBIE
                # The role is read again each time: a shell script becomes the JVM by exec.
                label = role(p, last[key][2] if key in last else None)
                last[key] = [
                    t.user + t.system,
                    t.children_user + t.children_system,
                    label,
                    ignoring[ppid],
                ]
                if key not in paths and not zombie and p.pid != proc.pid and "python" in label:
                    with contextlib.suppress(psutil.Error):
                        paths[key] = p.environ().get("PYTHONPATH", "")
                # A JVM shows as a zombie while its last threads still run: it is gone only
                # once reaped (by this process when it was orphaned, else by its parent).
                if (
                    zombie
                    and ppid == me
                    and p.pid != proc.pid
                    and os.waitpid(p.pid, os.WNOHANG)[0] == p.pid
                ):
                    reaped.add(key)
                    continue
                alive.append(p)
            except (
                psutil.NoSuchProcess,
                psutil.AccessDenied,
                ProcessLookupError,
                ChildProcessError,
            ):
                continue
        return alive

    wall = None
    root_done_at = 0.0
    killed = False
    series: list[tuple[float, float]] = []
    while True:
        alive = sample()
        series.append((time.perf_counter() - started, sum(v[0] for v in last.values())))
        if wall is None and proc.poll() is not None:
            wall = time.perf_counter() - started
            root_done_at = time.monotonic()
        if wall is not None and not alive:
            break
        waited = time.monotonic() - root_done_at if wall is not None else 0.0
        if waited > linger and not killed:
            for p in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            killed = True
        if waited > linger + 10:
            break  # zombies whose parents never reap them
        time.sleep(interval)
    tree_wall = time.perf_counter() - started
    reader.join(timeout=10)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rusage = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    by_role: dict[str, float] = {}
    lost = 0.0
    for key, (own, children, label, unaccounted) in last.items():
        by_role[label] = by_role.get(label, 0.0) + own
        if unaccounted and key not in reaped:
            lost += own + children
    sampled = sum(by_role.values())
    return TreeRun(
        returncode=int(proc.returncode),
        wall=float(wall or tree_wall),
        tree_wall=tree_wall,
        cpu=rusage + lost if exact else sampled,
        sampled=sampled,
        lost=lost,
        by_role=by_role,
        processes=len(last),
        lines=lines,
        series=series,
        start_epoch=start_epoch,
        python_paths=sorted(set(paths.values())),
        exact=exact,
    )
