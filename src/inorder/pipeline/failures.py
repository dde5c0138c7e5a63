"""Turning a failed streaming query into one line that names the cause and what to do.

Spark reports a failure of inorder's own code (the source's planner, a task, the batch
function) as a JVM exception whose message embeds the Python traceback. The operator needs
the inorder error inside it, not the trace: the trace goes to the run's log file, and the
line printed names the log.

A full, over-quota or read-only location surfaces in many shapes, depending on which writer
met it first: inorder's own state and batch files (Python ``OSError``), the Parquet, Delta
and Iceberg writers (pyarrow's ``Detail: [errno 28]``, object_store's ``(os error 28)``),
Spark's offsets and commits logs and its state store (a ``java.io.IOException`` wrapped in
Hadoop's ``FSError`` and Spark's own exceptions, often naming no file). Each ends in the same
line: what could not be written, the reason, that the batch was not committed, what to do.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from inorder.checkpoint.names import ENGINE_DIR, SPARK_DIR
from inorder.errors import (
    BrokerUnavailable,
    ConfigError,
    DataLossError,
    InorderError,
    IntegrityError,
    StorageError,
)

#: A Python exception line: any class of inorder's own (``inorder.kafka.admin.BrokerUnreachable``)
#: or one named like an error.
_PYTHON_ERROR = re.compile(
    r"^\s*(?P<cls>inorder\.[\w.]*[A-Z]\w*|[A-Za-z_][\w.]*(?:Error|Exception|Exit)): "
    r"(?P<message>\S.*)$"
)
_KNOWN: dict[str, type[InorderError]] = {
    "ConfigError": ConfigError,
    "DataLossError": DataLossError,
    "IntegrityError": IntegrityError,
    "InorderError": InorderError,
    # Met while the query ran: the broker answered the start's checks, so it is a broker
    # failure (exit 1), not a wrong bootstrap setting (the start's checks say that: exit 2).
    "BrokerUnreachable": BrokerUnavailable,
}
#: What follows a known error met while the query ran (its message names the setting).
_AFTER: dict[str, str] = {
    "BrokerUnreachable": "; the batch being planned was not committed: run again once the "
    "broker answers, and it resumes exactly",
}
#: Spark's error classes that mean another query writes the same checkpoint.
_CONCURRENT = (
    "CONCURRENT_STREAM_LOG_UPDATE",
    "CONCURRENT_QUERY",
    "ConcurrentModificationException",
)
#: What Spark says when a Python worker process died under a task (killed, out of memory).
_WORKER_DIED = "Python worker exited unexpectedly"

# -- a Python process that started too slowly -------------------------------------------------

#: What Spark says when a Python process it started (a streaming source's planner, a worker
#: without the daemon) did not connect back within the 10 s fixed in Spark's code
#: (``PythonWorkerFactory``). On a busy machine starting Python takes that long; a broken
#: Python (``PYSPARK_PYTHON`` without pyarrow) says the same, every time.
_SLOW_START = "Python worker failed to connect back"
#: The runner's line when it starts the query again after one.
SLOW_PYTHON_START_NOTE = (
    "a Python process Spark started did not connect back within Spark's fixed 10 s (a busy "
    "machine starts Python slowly): starting the query again from its checkpoint, which "
    "re-runs an unfinished batch with its output written once"
)


def slow_python_start(text: str) -> bool:
    """Whether a failure's text is Spark giving up on a Python process's start."""
    return _SLOW_START in text


# -- an unwritable location ---------------------------------------------------------------------

#: Errors only a write meets (full, over quota, read-only), by the words every writer uses
#: (strerror: Python, Java, Rust and pyarrow all quote it); a denied or failed read must not
#: read as a write, so nothing else counts.
_REASONS: dict[str, tuple[str, str]] = {
    "no space left on device": ("No space left on device", "free space on that filesystem"),
    "disk quota exceeded": ("Disk quota exceeded", "raise the disk quota or free space"),
    "read-only file system": (
        "Read-only file system",
        "make it writable (it is mounted read-only)",
    ),
}
_REASON = re.compile("|".join(re.escape(r) for r in _REASONS), re.IGNORECASE)
#: A file name in a message: absolute, or a URI; never a source line of a trace (``File "``
#: lines hold no reason) nor a date (``26/11/26``: no space or quote before it).
_PATH = re.compile(
    r"(?:(?<=[\s'\"(=\[])|^)(?P<path>(?:[a-z][a-z0-9+.-]*://[^\s'\"()\[\]#,;:/@]*|file:)?"
    r"/[^\s'\"()\[\]#,;:]+)",
    re.MULTILINE,
)
#: The refusal as Java (or Hadoop) reports it: its writes under the checkpoint are Spark's.
_JAVA = re.compile(r"(?:java|hadoop)\.[\w.$]*(?:Exception|Error): ")
#: Python's ``OSError``: the file follows the reason (``[Errno 28] No space left...: '/x'``).
_PATH_AFTER = re.compile(r"^: '(?P<path>[^']+)'")
#: Lines that continue the message above them: object_store's cause chain (``↳ reason``),
#: deltalake's ``Error: Os { ... }``.
_CONTINUED = re.compile(r"^\s*(?:↳|Error: Os \{)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: A temporary file standing for the one being written: Spark's ``.<batch>.<uuid>.tmp``
#: (and Hadoop's ``.crc`` of it) names batch ``<batch>``; inorder's ``.tmp-<hex>`` its folder.
_SPARK_TMP = re.compile(r"^\.{1,2}(?P<batch>\d+)\.[0-9a-f-]{36}\.tmp(?:\.crc)?$")
_OWN_TMP = re.compile(r"^\.tmp-[0-9a-f]+$")
#: Who wrote, when the error names no file: Spark's stack frames and error classes (in the
#: message or the run log), the first found wins. (marker, folder under the checkpoint or
#: None, what it is)
_JVM_WRITERS: tuple[tuple[str, str | None, str], ...] = (
    ("markMicroBatchStart", f"{SPARK_DIR}/offsets", "Spark's offsets log"),
    ("OffsetSeqLog", f"{SPARK_DIR}/offsets", "Spark's offsets log"),
    ("markMicroBatchEnd", f"{SPARK_DIR}/commits", "Spark's commits log"),
    ("CommitLog", f"{SPARK_DIR}/commits", "Spark's commits log"),
    ("CANNOT_WRITE_STATE_STORE", f"{SPARK_DIR}/state", "Spark's state store"),
    ("StateStore", f"{SPARK_DIR}/state", "Spark's state store"),
    ("HDFSMetadataLog", SPARK_DIR, "Spark's checkpoint"),
    ("CheckpointFileManager", SPARK_DIR, "Spark's checkpoint"),
    ("DiskBlockObjectWriter", None, "Spark's scratch directory (spark.local.dir)"),
    ("DiskStore", None, "Spark's scratch directory (spark.local.dir)"),
)
#: The same from a Python trace: the innermost frame wins (a sink's write runs inside the
#: engine's task, whose frames come first).
_PYTHON_WRITERS: tuple[tuple[str, str | None, str], ...] = (
    ("/inorder/state/", ENGINE_DIR, "inorder's state"),
    ("/inorder/engine/", ENGINE_DIR, "inorder's state"),
    ("/inorder/sinks/", None, "the pipeline's output"),
    ("/deltalake/", None, "the pipeline's output"),
    ("/pyiceberg/", None, "the pipeline's output"),
)
#: What a file under the checkpoint is, by its folder (the first match: deeper ones first).
_PARTS: tuple[tuple[str, str], ...] = (
    (f"{SPARK_DIR}/offsets", "Spark's offsets log"),
    (f"{SPARK_DIR}/commits", "Spark's commits log"),
    (f"{SPARK_DIR}/state", "Spark's state store"),
    (SPARK_DIR, "Spark's checkpoint"),
    (ENGINE_DIR, "inorder's state"),
)
#: How much of the run log's end is searched for the failed write (it rolls at 10 MB).
_LOG_TAIL = 1 << 20
#: A log record's first line (``%d{yy/MM/dd HH:mm:ss} %p``): its stack trace follows it.
_LOG_RECORD = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d ", re.MULTILINE)


@dataclass(frozen=True)
class Unwritable:
    """A write refused for lack of space, quota or a writable mount: where, why, what to do."""

    location: str
    reason: str
    action: str
    what: str = ""

    def line(self) -> str:
        """The one line to show (without the log file)."""
        what = f" ({self.what})" if self.what else ""
        return (
            f"cannot write {self.location}{what}: {self.reason}; the batch was not committed: "
            f"{self.action}, then run again (it resumes exactly)"
        )


def explain_failure(text: str, checkpoint: str, log_file: str | None = None) -> InorderError:
    """The error to show for a query or batch that failed with ``text`` (a JVM message)."""
    where = f" (full trace in {log_file})" if log_file else ""
    if any(marker in text for marker in _CONCURRENT):
        return ConfigError(
            f"another run of this pipeline is writing checkpoint {checkpoint} (Spark found "
            "its offsets log changed under it); stop the other copy, or give this one its own "
            f"pipeline.checkpoint{where}"
        )
    unwritable = find_unwritable(text, checkpoint, log_file)
    if unwritable is not None:
        return StorageError(f"{unwritable.line()}{where}")
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
        short = name.rsplit(".", 1)[-1]
        error_class = _KNOWN.get(short, InorderError)
        if not name.startswith("inorder."):
            message = f"{short}: {message}"
        return error_class(f"{message}{_AFTER.get(short, '')}{where}")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else "unknown failure"
    first = re.sub(r"^\[[A-Z_.]+\]\s*", "", first)
    return InorderError(f"query failed: {first}{where}")


def explain_exception(
    exc: BaseException, checkpoint: str, log_file: str | None = None
) -> InorderError:
    """:func:`explain_failure` for an exception raised in the driver (a sink's commit...).

    An inorder error stays as it is unless it, or the exception it was raised from (its
    ``__cause__``/``__context__``, kept even under ``raise ... from None``), is a refused
    write: that one becomes the unwritable line, with the reason the inorder message may
    have cut to its first line (object_store puts it on a third).
    """
    chain: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    unwritable = find_unwritable("\n".join(chain), checkpoint, log_file)
    if unwritable is not None:
        where = f" (full trace in {log_file})" if log_file else ""
        return StorageError(f"{unwritable.line()}{where}")
    if isinstance(exc, InorderError):
        return exc
    return explain_failure(chain[0], checkpoint, log_file)


def find_unwritable(text: str, checkpoint: str, log_file: str | None = None) -> Unwritable | None:
    """The refused write in ``text`` (a JVM message, a trace, an error line), else None.

    The file comes from the message; when it names none (Java's write of a full disk, Rust's
    ``Unable to copy data to file``), from the run log's record of the same failure; when
    neither does, the writer's folder: Spark's offsets or commits log or state store by its
    stack frames, and ``<checkpoint>/spark`` for any other JVM write.
    """
    text = _ANSI.sub("", text)
    found = _reason_and_path(text)
    if found is None:
        return None
    reason, path = found
    record = ""
    if path is None and log_file:
        record = _log_record(log_file)
        in_log = _reason_and_path(record) if record else None
        if in_log is not None and in_log[0] == reason:
            path = in_log[1]
    reason, action = _REASONS[reason.lower()]
    if path is not None:
        path = _written_file(path)
        return Unwritable(path, reason, action, _part_of(path, _local_root(checkpoint)))
    java = any(_JAVA.search(line) and _REASON.search(line) for line in text.splitlines())
    folder, what = _writer(f"{text}\n{record}", java)
    if folder is None:
        return Unwritable(what, reason, action)
    return Unwritable(f"{checkpoint.rstrip('/')}/{folder}", reason, action, what)


def _reason_and_path(text: str) -> tuple[str, str | None] | None:
    """The first refusal's words in ``text`` and the file its message names (or None)."""
    lines = text.splitlines()
    first: tuple[str, str | None] | None = None
    for n, line in enumerate(lines):
        for match in _REASON.finditer(line):
            after = _PATH_AFTER.match(line[match.end() :])
            path = after.group("path") if after else _last_path(line[: match.start()])
            k = n
            while path is None and k > 0 and _CONTINUED.match(lines[k]):
                k -= 1  # the reason on a line of its own: the file is on the line above
                path = _last_path(lines[k])
            if path is not None:
                return match.group(0), path
            if first is None:
                first = (match.group(0), None)
    return first


def _last_path(text: str) -> str | None:
    paths = [m.group("path").rstrip(".") for m in _PATH.finditer(text)]
    paths = [p for p in paths if len(p) > 1]
    return paths[-1] if paths else None


def _written_file(path: str) -> str:
    """The file a write was for: a temporary file stands for its final name or its folder."""
    folder, name = os.path.split(_local_path(path))
    spark = _SPARK_TMP.match(name)
    if spark is not None:
        return f"{folder}/{spark.group('batch')}"
    return folder if _OWN_TMP.match(name) else path


def _local_root(checkpoint: str) -> str:
    """The checkpoint as an absolute local path ("" for an object store)."""
    if re.match(r"^[a-z][a-z0-9+.-]*://", checkpoint) and not checkpoint.startswith("file:"):
        return ""
    return os.path.abspath(_local_path(checkpoint.rstrip("/")))


def _local_path(path: str) -> str:
    """``path`` without a ``file:`` scheme."""
    path = path.removeprefix("file://") if path.startswith("file:///") else path
    return path.removeprefix("file:") if path.startswith("file:/") else path


def _part_of(path: str, root: str) -> str:
    """What part of the checkpoint ``path`` is ("" outside it)."""
    if not root or not path.startswith(f"{root}/"):
        return ""
    relative = path[len(root) + 1 :]
    for folder, what in _PARTS:
        if relative == folder or relative.startswith(f"{folder}/"):
            return what
    return "the checkpoint"


def _writer(text: str, java: bool) -> tuple[str | None, str]:
    """(folder under the checkpoint or None, what) of the writer named by ``text``'s frames."""
    for marker, folder, what in _JVM_WRITERS:
        if marker in text:
            return folder, what
    if java:
        # The JVM writes nothing of inorder's: under the checkpoint, only Spark's folder. (Its
        # message may still carry Python frames: the batch function that called it.)
        return SPARK_DIR, "Spark's checkpoint"
    innermost = max(_PYTHON_WRITERS, key=lambda writer: text.rfind(writer[0]))
    if innermost[0] in text:
        return innermost[1], innermost[2]
    return None, "a file of this run (the error names none: see the log)"


def _log_record(log_file: str) -> str:
    """The run log's last record (a line and its stack trace) that holds a refused write."""
    try:
        with open(log_file, "rb") as log:
            log.seek(max(0, os.path.getsize(log_file) - _LOG_TAIL))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    starts = [m.start() for m in _LOG_RECORD.finditer(tail)]
    records = [tail[a:b] for a, b in zip([0, *starts], [*starts, len(tail)], strict=True)]
    refused = [r for r in records if _REASON.search(r)]
    # A later line may repeat the reason without its trace: the one with frames or a file.
    for record in reversed(refused):
        found = _reason_and_path(record)
        if (found and found[1]) or any(m in record for m, _, _ in _JVM_WRITERS):
            return record
    return refused[-1] if refused else ""


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
