"""Settings that ran "fine" and quietly did the wrong thing are reported when a run starts.

Reproduced before the change: a ``topic_pattern`` matching no topic exited 0 with
``records: 0`` and not a word about it (and the topics a pattern matched were never listed);
an ``integrity.sequence_field`` naming no field of the message type only showed up at run
time, as rule ``sequence_missing`` on every record; ``on_violation = "restart_session"`` on a
processor without ``starts_session`` ignored a key for good after its first violation.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from tests.e2e.cli_jobs import CountRaw, CountRawSessions, CountReadings

from inorder import Codec, Integrity, KafkaSource, ParquetSink, Pipeline, Processor
from inorder.checkpoint.layout import CheckpointLayout
from inorder.commands.run import dump_toml
from inorder.errors import ConfigError
from inorder.pipeline.config import validate
from inorder.pipeline.identity import IDENTITY_FIELD
from inorder.sinks.parquet import read_committed

ROOT = Path(__file__).resolve().parents[2]


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, key=b"k", value=value)
    producer.flush(30)


def _readings(count: int) -> list[bytes]:
    """One site whose ``value`` goes up by exactly one: a valid sequence."""
    return [f'{{"site": "s", "value": {i}}}'.encode() for i in range(count)]


def _toml(
    tmp_path: Path,
    bootstrap: str,
    source: dict[str, Any],
    pipeline: dict[str, Any] | None = None,
    **sections: dict[str, Any],
) -> Path:
    config = validate(
        {
            "pipeline": {
                "checkpoint": str(tmp_path / "ck"),
                "trigger": "available-now",
                "progress": "plain",
                **(pipeline or {}),
            },
            "source": {"bootstrap_servers": bootstrap, **source},
            "codec": {"type": "raw"},
            "processor": {"type": "tests.e2e.cli_jobs:CountRaw"},
            "sink": {"path": str(tmp_path / "out")},
            "spark": {"master": "local[1]"},
            **sections,
        }
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "p.toml"
    path.write_text(dump_toml(config))
    return path


def _pipeline(
    bootstrap: str,
    topic: str,
    processor: Processor[Any, Any, Any],
    integrity: Integrity,
    work: Path,
    codec: Codec[Any] | None = None,
) -> Pipeline[Any, Any, Any]:
    """One topic read to its end by ``processor`` on one core; output and checkpoint in ``work``."""
    return Pipeline(
        source=KafkaSource(bootstrap_servers=bootstrap, topics=[topic]),
        processor=processor,
        codec=codec,
        integrity=integrity,
        sink=ParquetSink(str(work / "out")),
        checkpoint=str(work / "ck"),
        trigger="available-now",
        spark_master="local[1]",
        progress="quiet",
    )


def _run(path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "inorder.cli", "run", str(path), *flags]
    return subprocess.run(
        command, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def _env() -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}


def _first_line_then_stop(path: Path, wanted: Callable[[str], bool]) -> str:
    """Start ``inorder run``, wait for the first stderr line ``wanted`` picks, then end it.

    For runs that would go on (a processing-time trigger waiting for topics): the run is
    killed with its JVM once the line is there.
    """
    command = [sys.executable, "-m", "inorder.cli", "run", str(path)]
    lines: queue.Queue[str | None] = queue.Queue()
    proc = subprocess.Popen(
        command,
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its JVM too
    )

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while True:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, "the run ended first:\n" + "\n".join(seen)
            seen.append(line)
            if wanted(line):
                return line
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _refused(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a start refused with exit code 2."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_pattern_lists_its_topics_and_warns_when_it_matches_none(
    kafka: Any, tmp_path: Path
) -> None:
    prefix = f"sub{random.randrange(10**9)}-"
    for site in ("c", "a", "b"):
        _produce(kafka.bootstrap_servers, kafka.new_topic(prefix + site), [b"x", b"y"])
    matched = _run(
        _toml(tmp_path / "some", kafka.bootstrap_servers, {"topic_pattern": f"{prefix}.*"})
    )
    assert matched.returncode == 0, matched.stderr
    line = f"inorder: subscribed to 3 topics matching '{prefix}.*': {prefix}a, {prefix}b, {prefix}c"
    assert line in matched.stderr.splitlines(), matched.stderr
    assert "records: 6" in matched.stderr
    # The JVM's own lines (Java's "WARNING: Using incubator modules") go to the run's log.
    assert "WARNING: " not in matched.stderr, matched.stderr

    # A long-running query may wait for its topics: not an error, a warning naming the
    # closest topic names (a typo is the likely cause).
    typo = f"{prefix[:-1]}_.*"
    waiting = _toml(
        tmp_path / "none",
        kafka.bootstrap_servers,
        {"topic_pattern": typo, "topic_discovery_interval": "45 seconds"},
        pipeline={"trigger": "1 second"},
    )
    warning = _first_line_then_stop(waiting, lambda line: line.startswith("inorder: warning:"))
    assert warning == (
        f"inorder: warning: topic_pattern {typo!r} matches no topic on "
        f"{kafka.bootstrap_servers} (closest topics: {prefix}a, {prefix}b, {prefix}c): nothing "
        "is read until a matching topic appears (looked for every 45 s, "
        "topic_discovery_interval)"
    )


@pytest.mark.parametrize("trigger", ["available-now", "once"])
def test_a_pattern_matching_nothing_is_refused_when_the_run_would_end(
    kafka: Any, tmp_path: Path, trigger: str
) -> None:
    prefix = f"end{random.randrange(10**9)}-"
    for site in ("a", "b"):
        _produce(kafka.bootstrap_servers, kafka.new_topic(prefix + site), [b"x"])
    typo = f"{prefix[:-1]}_.*"
    path = _toml(tmp_path, kafka.bootstrap_servers, {"topic_pattern": typo})
    line = _refused(_run(path, "--trigger", trigger))
    # Its own topics are the closest, best first; a similar name another test left on the
    # shared broker (the other trigger's "end<digits>-a") may follow them.
    head, _, rest = line.partition("(closest topics: ")
    closest, _, tail = rest.partition("): ")
    assert head == (
        f"inorder: error: topic_pattern {typo!r} matches no topic on {kafka.bootstrap_servers} "
    ), line
    assert closest.split(", ")[:2] == [f"{prefix}a", f"{prefix}b"], line
    assert tail == (
        "under trigger available-now or once the run would read nothing; correct the pattern, "
        "or create a matching topic first"
    ), line
    # Nothing about the refused run is in the checkpoint: the corrected pattern just runs
    # (a recorded subscription would have to be changed with --accept-changes).
    info = CheckpointLayout.of(str(tmp_path / "ck")).read_info() or {}
    assert IDENTITY_FIELD not in info, info
    fixed = validate(tomllib.loads(path.read_text()))
    fixed["source"]["topic_pattern"] = f"{prefix}.*"
    path.write_text(dump_toml(fixed))
    done = _run(path, "--trigger", trigger)
    assert done.returncode == 0, done.stderr
    assert "records: 2" in done.stderr, done.stderr


def test_a_listed_topic_that_does_not_exist_is_refused_naming_the_way_out(
    kafka: Any, tmp_path: Path
) -> None:
    missing = f"missing-{random.randrange(10**9)}"
    line = _refused(_run(_toml(tmp_path, kafka.bootstrap_servers, {"topics": [missing]})))
    assert f"unknown topic(s) {missing}" in line and "topic_pattern" in line, line


def test_an_unknown_sequence_field_is_refused_before_any_batch(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"seq-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, _readings(10))

    def pipeline(sequence_field: str, where: str) -> Pipeline[Any, Any, Any]:
        integrity = Integrity.strict(sequence_field=sequence_field)
        return _pipeline(
            kafka.bootstrap_servers, topic, CountReadings(), integrity, tmp_path / where
        )

    with pytest.raises(ConfigError) as refused:
        pipeline("valeu", "typo").run()
    message = str(refused.value)
    assert "integrity.sequence_field = 'valeu'" in message, message
    assert "Reading (its fields: site, value)" in message and "'value'" in message, message
    assert not (tmp_path / "typo" / "ck" / "spark").exists(), "no batch may have run"

    summary = pipeline("value", "right").run()
    assert summary.records == 10 and summary.violations == {}
    assert read_committed(str(tmp_path / "right" / "out")).num_rows == 10

    toml = _toml(
        tmp_path / "cli",
        kafka.bootstrap_servers,
        {"topics": [topic]},
        codec={"type": "json"},
        processor={"type": "tests.e2e.cli_jobs:CountReadings"},
        integrity={"sequence_field": "seqno"},
    )
    line = _refused(_run(toml))
    assert "integrity.sequence_field = 'seqno'" in line and "site, value" in line, line


def test_restart_session_without_starts_session_is_refused(
    kafka: Any, spark: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(f"restart-{random.randrange(10**9)}")
    _produce(kafka.bootstrap_servers, topic, [b"a", b"b", b"", b"c"])

    def pipeline(processor: CountRaw, where: str) -> Pipeline[Any, Any, Any]:
        from inorder.codecs.raw import RawCodec

        integrity = Integrity.strict(on_violation="restart_session")
        return _pipeline(
            kafka.bootstrap_servers, topic, processor, integrity, tmp_path / where, RawCodec()
        )

    with pytest.raises(ConfigError) as refused:
        pipeline(CountRaw(), "without").run()
    message = str(refused.value)
    assert message.startswith("integrity.on_violation = 'restart_session': CountRaw"), message
    assert "has no starts_session" in message and "could never restart" in message, message
    assert "implement CountRaw.starts_session" in message, message
    assert "'fail' or 'dead_letter'" in message, message
    assert not (tmp_path / "without" / "ck" / "spark").exists(), "no batch may have run"

    summary = pipeline(CountRawSessions(), "with").run()
    assert summary.records == 4

    toml = _toml(
        tmp_path / "cli",
        kafka.bootstrap_servers,
        {"topics": [topic]},
        integrity={"on_violation": "restart_session"},
    )
    line = _refused(_run(toml))
    assert "integrity.on_violation" in line and "CountRaw has no starts_session" in line, line
