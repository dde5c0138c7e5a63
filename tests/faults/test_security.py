"""Security basics: secrets never leave in any output, and services listen on loopback only.

One session pipeline writes to the S3 server with its credentials in the pipeline file; every
place a user or a log collector can see is searched for the secret value: ``--print-config``,
the run's stdout (JSON progress) and stderr, every file under the checkpoint (info file, run
log, batch history, lease), and the one-line error of a refused start. The processes the
project starts (broker, S3 server, the run's driver and its JVM) must listen on loopback only.
"""

from __future__ import annotations

import ipaddress
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from inorder.commands.run import dump_toml
from inorder.dev import services
from inorder.dev.simulator import simulate
from tests.fixtures.sessions_job import (
    TWO_LOCAL_CORES,
    run_command,
    sessions_config,
    spark_child_env,
    two_partition_simulation,
)


def _listening(pid: int) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening socket of ``pid`` and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in procs:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr:
                    found.append((conn.laddr.ip, conn.laddr.port, proc.pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _is_loopback(text: str) -> bool:
    address = ipaddress.ip_address(text.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # the JVM's ::ffff:127.0.0.1
    return address.is_loopback


def _not_loopback(sockets: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    return [s for s in sockets if not _is_loopback(s[0])]


def test_dev_services_listen_on_loopback_only(kafka: Any, s3: Any, matrix: Any) -> None:
    pids = []
    for name, service in (("kafka", kafka), ("s3", s3)):
        if service.external or service.state_dir is None:
            continue
        (report,) = services.status(service.state_dir, only=[name])
        assert report.pid is not None
        pids.append(report.pid)
    sockets = [s for pid in pids for s in _listening(pid)]
    assert sockets, "no listening socket found: the check would prove nothing"
    assert _not_loopback(sockets) == []
    matrix.record(
        group="security",
        fault="dev broker and S3 server: listening addresses",
        times=1,
        outcome="refused",
        check=f"{len(sockets)} listening sockets, all on loopback",
        ok=True,
    )


def _leaks(secret: str, texts: dict[str, str]) -> list[str]:
    return [where for where, text in texts.items() if secret in text]


def test_secrets_never_printed_recorded_or_logged(
    kafka: Any, s3: Any, tmp_path: Path, matrix: Any
) -> None:
    secret = s3.secret_access_key
    prefix = f"sec-{random.randrange(10**9)}-"
    simulate(
        two_partition_simulation(prefix, 5, sessions_per_site=2, rows_per_snapshot=3, messages=300),
        kafka.bootstrap_servers,
    )
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        trigger="1 second",
        progress="json",
        sink={
            "path": f"{s3.new_prefix()}/out",
            "partition_by": ["topic"],
            "storage_options": s3.storage_options(),
        },
        spark=TWO_LOCAL_CORES,
    )
    toml = tmp_path / "p.toml"
    toml.write_text(dump_toml(config))
    assert secret in toml.read_text()  # the file itself holds it: everything else must not
    env = {
        k: v for k, v in spark_child_env().items() if not k.startswith("AWS_")
    }  # credentials come from the file only
    texts: dict[str, str] = {}
    printed = subprocess.run(
        run_command(toml, "--print-config"), env=env, capture_output=True, text=True, timeout=60
    )
    assert printed.returncode == 0, printed.stderr
    texts["--print-config"] = printed.stdout + printed.stderr

    run = subprocess.Popen(
        run_command(toml),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        commits = tmp_path / "checkpoint" / "spark" / "commits"
        deadline = time.monotonic() + 240
        while not (commits.exists() and any(p.name.isdigit() for p in commits.iterdir())):
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never committed a batch"
            time.sleep(0.5)
        sockets = _listening(run.pid)
        # A refused second start prints its one-line error: no secret in it either.
        refused = subprocess.run(
            run_command(toml), env=env, capture_output=True, text=True, timeout=120
        )
        assert refused.returncode == 2, refused.stderr
        texts["refused start"] = refused.stdout + refused.stderr
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err[-3000:]
    texts["run stdout"], texts["run stderr"] = out, err
    for path in (tmp_path / "checkpoint").rglob("*"):
        if path.is_file():
            texts[str(path.relative_to(tmp_path))] = path.read_bytes().decode("latin-1")
    assert "inorder-checkpoint.json" in " ".join(texts) and any(
        "inorder-run.log" in name for name in texts
    )
    leaks = _leaks(secret, texts)
    assert leaks == [], f"the secret appears in {leaks}"
    matrix.record(
        group="security",
        fault="S3 secret in the pipeline file: every output searched",
        times=len(texts),
        outcome="refused",
        check=f"secret in none of {len(texts)} outputs (--print-config, stdout, stderr, "
        "refused start, every checkpoint file)",
        ok=True,
    )
    assert sockets, "the run listens on nothing? the check would prove nothing"
    wide = _not_loopback(sockets)
    matrix.record(
        group="security",
        fault="a run's driver and JVM: listening addresses",
        times=1,
        outcome="refused",
        check=f"{len(sockets)} listening sockets, "
        + ("all on loopback" if not wide else f"NOT loopback: {wide}"),
        ok=not wide,
    )
    assert wide == [], wide
