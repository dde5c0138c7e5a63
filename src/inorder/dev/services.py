"""Start, stop and check the local Kafka broker (noida-db), S3 server (SeaweedFS) and registry.

Everything lives in one state directory (default ``.inorder/dev``)::

    services.json        pids, ports, endpoints, S3 credentials (mode 0600)
    kafka/ kafka.log     broker data and output
    s3/ s3.log           S3 server data and output
    registry/ registry.log   schema registry data (registry.json) and output
    s3-identities.json   the S3 server's credentials file (mode 0600)

All servers listen on 127.0.0.1 only and run in their own process group, so stopping the group
also stops helpers they spawn. A process is identified by pid *and* start time, so a recycled
pid is never signalled. ``up`` is idempotent; ``down`` stops only processes recorded here.

This module keeps the services file and decides what to start or stop;
:mod:`inorder.dev.servers` launches and probes each server. The same code backs
``inorder dev up|down|status`` and the test fixtures.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inorder.dev.processes import (
    HOST,
    DevServiceError,
    check_port,
    free_ports,
    process_alive,
    stop_process,
    tcp_open,
)
from inorder.dev.servers import (
    generate_credentials,
    kafka_metadata,
    registry_health,
    s3_health,
    start_kafka,
    start_registry,
    start_s3,
    write_private,
)
from inorder.endpoints import (
    DEFAULT_BUCKET,
    DEFAULT_REGION,
    SERVICES_FILE,
    read_services_file,
)

__all__ = [
    "DEFAULT_KAFKA_PORT",
    "DEFAULT_REGISTRY_PORT",
    "DEFAULT_S3_PORT",
    "SERVICES",
    "ServiceReport",
    "down",
    "generate_credentials",
    "kafka_metadata",
    "registry_health",
    "s3_health",
    "status",
    "up",
    "write_services_file",
]

SERVICES = ("kafka", "s3", "registry")
DEFAULT_KAFKA_PORT = 9092
DEFAULT_S3_PORT = 8333
DEFAULT_REGISTRY_PORT = 8081
#: Per service: default port and the ``inorder dev up`` option that sets it.
_PORTS = {
    "kafka": (DEFAULT_KAFKA_PORT, "--kafka-port"),
    "s3": (DEFAULT_S3_PORT, "--s3-port"),
    "registry": (DEFAULT_REGISTRY_PORT, "--registry-port"),
}

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


# --------------------------------------------------------------------------- state file


def write_services_file(state_dir: Path, data: dict[str, Any]) -> None:
    """Atomically write services.json with mode 0600 (it holds the S3 secret)."""
    write_private(state_dir / SERVICES_FILE, json.dumps(data, indent=2, sort_keys=True) + "\n")


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


# --------------------------------------------------------------------------- commands


def _selected(only: Collection[str] | None) -> list[str]:
    if not only:
        return list(SERVICES)
    unknown = sorted(set(only) - set(SERVICES))
    if unknown:
        raise DevServiceError(f"--only: unknown service {unknown[0]!r} (use {', '.join(SERVICES)})")
    return [s for s in SERVICES if s in only]


def up(
    state_dir: Path,
    *,
    kafka_port: int | None = None,
    s3_port: int | None = None,
    registry_port: int | None = None,
    only: Collection[str] | None = None,
    bucket: str | None = None,
    credentials: tuple[str, str] | None = None,
    region: str | None = None,
    die_with_parent: bool = False,
) -> list[ServiceReport]:
    """Start the selected services unless already running; return what happened.

    Ports: the given one (0 = any free port), else the one recorded by a previous ``up``,
    else 9092 (Kafka) / 8333 (S3) / 8081 (schema registry). S3 credentials: the given pair,
    else the recorded pair, else freshly generated. On failure, services started by this
    call are stopped again.
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
                requested = {"kafka": kafka_port, "s3": s3_port, "registry": registry_port}[name]
                default, option = _PORTS[name]
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
                port = requested if requested is not None else int(old.get("port") or default)
                if port == 0:
                    (port,) = free_ports(1)
                else:
                    check_port(name, option, port)
                if name == "kafka":
                    entry = start_kafka(state_dir, port, die_with_parent)
                elif name == "registry":
                    entry = start_registry(state_dir, port, die_with_parent)
                else:
                    key_id, secret = credentials or (
                        (str(old["access_key_id"]), str(old["secret_access_key"]))
                        if old.get("access_key_id") and old.get("secret_access_key")
                        else generate_credentials()
                    )
                    entry = start_s3(
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
            elif name == "registry":
                detail = registry_health(str(entry["url"]))
            else:
                detail = s3_health(entry)
            reports.append(ServiceReport(name, "running", pid, True, detail, entry))
        except DevServiceError as exc:
            reports.append(ServiceReport(name, "unhealthy", pid, False, str(exc), entry))
    return reports
