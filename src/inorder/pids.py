"""Processes identified by pid *and* kernel start time, so a recycled pid is never mistaken.

The lowest piece of the dev services: finding where a running service is
(:mod:`inorder.endpoints`) only needs to tell whether a recorded process still runs, and
must not import the code that starts servers (:mod:`inorder.dev.processes`) to do so.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Popen objects of servers started by this process, kept so they can be reaped (a zombie
# would still look alive to kill(pid, 0)) and so no ResourceWarning fires while they run.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_EXIT_CODES: dict[int, int] = {}


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, ``None`` if unreadable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which is in parentheses and may contain spaces.
    return raw[raw.rfind(")") + 2 :].split()


def process_start_time(pid: int) -> str | None:
    """The kernel start time of ``pid`` (clock ticks since boot), ``None`` if unknown."""
    fields = proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def keep_child(proc: subprocess.Popen[bytes]) -> None:
    """Remember a server this process started, so :func:`reap` can collect it."""
    _CHILDREN[proc.pid] = proc


def reap(pid: int) -> None:
    """Collect ``pid`` if this process started it and it has exited (no zombie is left)."""
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        _EXIT_CODES[pid] = proc.returncode
        del _CHILDREN[pid]


def exit_code(pid: int) -> int | None:
    """The exit code of a child this process started, ``None`` while it runs or if unknown."""
    proc = _CHILDREN.get(pid)
    return _EXIT_CODES.get(pid) if proc is None else proc.poll()


def process_alive(pid: int, start_time: str | None = None) -> bool:
    """True if ``pid`` runs, is not a zombie and (if given) started at ``start_time``."""
    reap(pid)
    fields = proc_stat(pid)
    if fields is None:
        if Path("/proc/self/stat").exists():
            return False
        try:  # no procfs: best effort
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if fields[0] in ("Z", "X"):
        return False
    return start_time is None or fields[19] == start_time
