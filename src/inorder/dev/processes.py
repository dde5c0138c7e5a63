"""Local processes and ports of the dev services: spawn, identify, stop; find free ports.

A process is identified by pid *and* kernel start time, so a recycled pid is never signalled.
Telling whether a recorded process still runs lives below, in :mod:`inorder.pids`, so that
finding a service (:mod:`inorder.endpoints`) does not import the code that starts servers;
its names are re-exported here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

from inorder.errors import InorderError
from inorder.pids import exit_code as exit_code
from inorder.pids import keep_child, proc_stat
from inorder.pids import process_alive as process_alive
from inorder.pids import process_start_time as process_start_time
from inorder.pids import reap as reap

HOST = "127.0.0.1"
STOP_TIMEOUT = 20.0


class DevServiceError(InorderError):
    """A dev service could not be started, stopped or reached."""


# --------------------------------------------------------------------------- processes


def stop_process(pid: int, start_time: str | None, timeout: float = STOP_TIMEOUT) -> bool:
    """SIGTERM the process group of ``pid`` (SIGKILL after ``timeout``); False if not running.

    Only signals when pid and start time still match, so a recycled pid is left alone.
    """
    if not process_alive(pid, start_time):
        return False
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return False

    # Servers are started as session leaders (pgid == pid); signal the whole group so a
    # wrapper's child binary goes too. Anything else gets only its own pid.
    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if pgid == pid:
                os.killpg(pgid, sig)
            else:
                os.kill(pid, sig)

    send(signal.SIGTERM)
    if _wait_gone(pid, start_time, timeout):
        return True
    send(signal.SIGKILL)
    if not _wait_gone(pid, start_time, 10.0):
        raise DevServiceError(f"process {pid} did not exit after SIGKILL")
    return True


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid`` (Linux /proc; else ``[]``)."""
    members = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = proc_stat(int(entry.name))
        # fields: state, ppid, pgrp, ...
        if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in "ZX":
            members.append(int(entry.name))
    return members


def _wait_gone(pid: int, start_time: str | None, timeout: float) -> bool:
    # The leader exiting is not enough: a wrapper's child (the real server) may still run.
    deadline = time.monotonic() + timeout
    while True:
        if not process_alive(pid, start_time) and not group_members(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _parent_death_signal() -> None:
    # Runs in the child between fork and exec: ask Linux to SIGTERM it when the parent
    # (a test run) dies, even by SIGKILL or `timeout`, so no server outlives its tests.
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def spawn(
    argv: list[str],
    log_path: Path,
    cwd: Path,
    die_with_parent: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[int, str | None]:
    """Start ``argv`` as the leader of its own process group, output appended to ``log_path``.

    Returns (pid, start time). With ``die_with_parent`` (Linux) the child gets SIGTERM when
    this process dies, even by SIGKILL, so no server outlives the tests that started it.
    """
    preexec = _parent_death_signal if die_with_parent and sys.platform == "linux" else None
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group; survives the terminal closing
            close_fds=True,
            preexec_fn=preexec,
        )
    keep_child(proc)
    return proc.pid, process_start_time(proc.pid)


# --------------------------------------------------------------------------- ports


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if nothing could listen on ``host:port`` now (servers use SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports free right now (held together while picking)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port_with_partner(offset: int, avoid: Collection[int], host: str = HOST) -> int:
    """A free port p such that p + ``offset`` is free too (neither in ``avoid``)."""
    # weed mini's embedded worker dials the admin gRPC port at admin port + 10000 whatever
    # -admin.port.grpc says, so both ports must be free.
    for _ in range(200):
        (port,) = free_ports(1, host)
        if port + offset > 65535 or port in avoid or port + offset in avoid:
            continue
        if not port_in_use(port + offset, host):
            return port
    raise DevServiceError(f"no free port pair (p, p+{offset}) found on {host}")


def tcp_open(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    """True if a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process group ``pid`` (a server we started) holds the listening socket of
    ``port``; ``None`` where Linux's ``/proc`` cannot tell.

    A port found free can be taken by another server before ours binds it: ours then exits
    ("port in use") while the other one answers the readiness probe. Asking who listens
    keeps a service from being recorded as started on someone else's port.
    """
    inodes: set[str] = set()
    found_table = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found_table = True
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; field 9 is the inode.
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(fields[9])
    if not found_table:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for member in {pid, *group_members(pid)}:
        try:
            fds = os.listdir(f"/proc/{member}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{member}/fd/{fd}") in wanted:
                    return True
    return False


def check_port(name: str, option: str, port: int) -> None:
    """Refuse a port out of range or in use, naming the command-line ``option``."""
    if not 0 < port < 65536:
        raise DevServiceError(f"{option}: port {port} is out of range (1-65535, or 0 = any)")
    if port_in_use(port):
        raise DevServiceError(
            f"{name} port {port} on {HOST} is already in use: stop what uses it or pass "
            f"{option} N (0 picks a free port)"
        )
