"""Turning a failed streaming query into one line that names the cause and what to do.

Spark reports a failure of inorder's own code (the source's planner, a task, the batch
function) as a JVM exception whose message embeds the Python traceback. The operator needs
the inorder error inside it, not the trace: the trace goes to the run's log file, and the
line printed names the log.
"""

from __future__ import annotations

import errno
import re

from inorder.errors import ConfigError, DataLossError, InorderError, IntegrityError

_PYTHON_ERROR = re.compile(
    r"^\s*(?P<cls>[A-Za-z_][\w.]*(?:Error|Exception|Exit)): (?P<message>\S.*)$"
)
_KNOWN: dict[str, type[InorderError]] = {
    "ConfigError": ConfigError,
    "DataLossError": DataLossError,
    "IntegrityError": IntegrityError,
    "InorderError": InorderError,
}
#: Spark's error classes that mean another query writes the same checkpoint.
_CONCURRENT = (
    "CONCURRENT_STREAM_LOG_UPDATE",
    "CONCURRENT_QUERY",
    "ConcurrentModificationException",
)
#: What Spark says when a Python worker process died under a task (killed, out of memory).
_WORKER_DIED = "Python worker exited unexpectedly"
#: An operating-system error naming a file: ``[Errno 28] No space left on device: '/x/y'``.
_OS_ERROR = re.compile(r"^\[Errno (?P<errno>\d+)\] (?P<reason>[^:]+): '(?P<path>.+)'$")
#: Errors only a write meets (full, over quota, read-only); a denied or failed read must not
#: read as a write.
_UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def explain_failure(text: str, checkpoint: str, log_file: str | None = None) -> InorderError:
    """The error to show for a query or batch that failed with ``text`` (a JVM message)."""
    where = f" (full trace in {log_file})" if log_file else ""
    if any(marker in text for marker in _CONCURRENT):
        return ConfigError(
            f"another run of this pipeline is writing checkpoint {checkpoint} (Spark found "
            "its offsets log changed under it); stop the other copy, or give this one its own "
            f"pipeline.checkpoint{where}"
        )
    if _WORKER_DIED in text:
        # The task fails with a Py4JJavaError around it; the cause is the dead process.
        return InorderError(
            "a Spark Python worker died while running this batch's tasks (killed, or out of "
            "memory: see the kernel log); the batch was not committed, so running again "
            f"resumes exactly{where}"
        )
    found = _python_error(text)
    if found is not None:
        name, message = found
        error_class = _KNOWN.get(name.rsplit(".", 1)[-1], InorderError)
        unwritable = _unwritable(message)
        if unwritable is not None:
            return InorderError(f"{unwritable}{where}")
        if not name.startswith("inorder."):
            message = f"{name.rsplit('.', 1)[-1]}: {message}"
        return error_class(f"{message}{where}")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else "unknown failure"
    first = re.sub(r"^\[[A-Z_.]+\]\s*", "", first)
    return InorderError(f"query failed: {first}{where}")


def _unwritable(message: str) -> str | None:
    """The line for a write refused by the operating system (a full disk...), else None."""
    match = _OS_ERROR.match(message)
    if match is None or int(match.group("errno")) not in _UNWRITABLE:
        return None
    return (
        f"cannot write {match.group('path')}: {match.group('reason')}; the batch was not "
        "committed: run again once the location is writable (it resumes exactly)"
    )


def _python_error(text: str) -> tuple[str, str] | None:
    """The innermost Python exception in a message: inorder's own first, else the last one."""
    found: list[tuple[str, str]] = []
    for line in text.splitlines():
        match = _PYTHON_ERROR.match(line)
        if match is None:
            continue
        name = match.group("cls")
        if name.startswith(("org.", "java.", "scala.", "py4j.")) or name.endswith("Exit"):
            continue
        found.append((name, match.group("message").strip()))
    if not found:
        return None
    own = [f for f in found if f[0].startswith("inorder.")]
    return (own or found)[-1]
