"""The catalogue of bad input: every class the product knows, with the exact line the user sees.

Settings problems are quick CLI runs (``inorder run`` refuses before Spark starts, exit code
2, one line); data problems run a pipeline on the shared local SparkSession under the
``fail`` policy and end in one named error. Each case records a fault-matrix row whose check
is the message itself.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import TopicPartition as KafkaTopicPartition

from inorder import Integrity, KafkaSource, ParquetSink, Pipeline
from inorder.errors import InorderError
from inorder.pipeline.progress import PlainReporter
from inorder.pipeline.runner import PipelineRunner
from tests.e2e.cli_jobs import CountReadings

ROOT = Path(__file__).resolve().parents[2]
GOOD_TAIL = '[processor]\ntype = "tests.e2e.cli_jobs:CountRaw"\n[codec]\ntype = "raw"\n'


def _cli(toml: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "inorder.cli", "run", str(toml), *flags],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _one_line(done: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


#: name -> (pipeline file text, the exact line; ``{file}`` is the file's path).
SETTINGS_CASES: dict[str, tuple[str, str]] = {
    "bad TOML": (
        '[pipeline\nname = "x"\n',
        "inorder: error: {file}: invalid TOML: Expected ']' at the end of a table declaration "
        "(at line 1, column 10)",
    ),
    "wrong type": (
        '[source]\ntopics = ["t"]\nmax_offsets_per_trigger = "ten"\n[sink]\npath = "o"\n'
        + GOOD_TAIL,
        "inorder: error: {file}: source.max_offsets_per_trigger must be an integer, not str 'ten'",
    ),
    "unknown key": (
        '[source]\ntopics = ["t"]\nmax_offset_per_trigger = 5\n[sink]\npath = "o"\n' + GOOD_TAIL,
        "inorder: error: {file}: unknown key source.max_offset_per_trigger (did you mean "
        "'max_offsets_per_trigger'?)",
    ),
    "unknown section": (
        '[pipelin]\nname = "x"\n[sink]\npath = "o"\n' + GOOD_TAIL,
        "inorder: error: {file}: unknown section [pipelin] (did you mean 'pipeline'?)",
    ),
    "missing required setting": (
        '[source]\ntopics = ["t"]\n[sink]\npath = "o"\n',
        "inorder: error: {file}: missing required setting processor.type",
    ),
    "bad duration": (
        '[pipeline]\ntrigger = "10 parsecs"\n[source]\ntopics = ["t"]\n[sink]\npath = "o"\n'
        + GOOD_TAIL,
        "inorder: error: {file}: pipeline.trigger: invalid duration '10 parsecs': expected e.g. "
        "'500 ms', '30 seconds', '15 minutes', '1 hour', '2 days'; or 'available-now' / 'once'",
    ),
}


@pytest.mark.parametrize("case", list(SETTINGS_CASES))
def test_bad_settings_are_one_named_line(tmp_path: Path, matrix: Any, case: str) -> None:
    text, expected = SETTINGS_CASES[case]
    toml = tmp_path / "p.toml"
    toml.write_text(text)
    seen = set()
    for flags in (["--print-config"], []):  # printing and running refuse alike
        seen.add(_one_line(_cli(toml, *flags)))
    line = expected.format(file=toml)
    assert seen == {line}, seen
    matrix.record(group="bad input", fault=case, times=2, outcome="refused", check=line, ok=True)


def _toml(tmp_path: Path, source: str, sink: str = "", checkpoint: Path | None = None) -> Path:
    toml = tmp_path / "p.toml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    ck = checkpoint or tmp_path / "ck"
    sink = sink or f'path = "{out}"'
    toml.write_text(
        f'[pipeline]\ncheckpoint = "{ck}"\ntrigger = "available-now"\n'
        f"[source]\n{source}[sink]\n{sink}\n" + GOOD_TAIL + '[spark]\nmaster = "local[1]"\n'
    )
    return toml


def test_unreachable_broker(tmp_path: Path, matrix: Any) -> None:
    toml = _toml(tmp_path, 'bootstrap_servers = "127.0.0.1:1"\ntopics = ["t"]\n')
    line = _one_line(_cli(toml))
    assert line.startswith("inorder: error: ") and "127.0.0.1:1" in line, line
    matrix.record(
        group="bad input",
        fault="unreachable broker",
        times=1,
        outcome="refused",
        check=line,
        ok=True,
    )


def test_missing_topic_and_unwritable_checkpoint(kafka: Any, tmp_path: Path, matrix: Any) -> None:
    servers = kafka.bootstrap_servers
    missing = f"missing-{random.randrange(10**9)}"
    toml = _toml(tmp_path / "a", f'bootstrap_servers = "{servers}"\ntopics = ["{missing}"]\n')
    line = _one_line(_cli(toml))
    assert missing in line, line
    matrix.record(
        group="bad input",
        fault="listed topic does not exist",
        times=1,
        outcome="refused",
        check=line,
        ok=True,
    )
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    topic = kafka.new_topic()
    toml = _toml(
        tmp_path / "b",
        f'bootstrap_servers = "{servers}"\ntopics = ["{topic}"]\n',
        checkpoint=blocker / "ck",
    )
    line = _one_line(_cli(toml))
    assert line == (
        f"inorder: error: checkpoint '{blocker / 'ck'}' is not writable: Not a directory"
    ), line
    matrix.record(
        group="bad input",
        fault="unwritable checkpoint path",
        times=1,
        outcome="refused",
        check=line,
        ok=True,
    )


@pytest.mark.parametrize("problem", ["unreachable S3", "bad S3 credentials"])
def test_s3_sink_problems(kafka: Any, s3: Any, tmp_path: Path, matrix: Any, problem: str) -> None:
    topic = kafka.new_topic()
    endpoint = "http://127.0.0.1:1" if problem == "unreachable S3" else s3.endpoint_url
    sink = (
        f'path = "{s3.new_prefix()}/out"\n[sink.storage_options]\nendpoint_url = "{endpoint}"\n'
        f'access_key_id = "{s3.access_key_id}"\nsecret_access_key = "wrong-secret-123"\n'
        'allow_http = "true"\n'
    )
    toml = _toml(
        tmp_path,
        f'bootstrap_servers = "{kafka.bootstrap_servers}"\ntopics = ["{topic}"]\n',
        sink=sink,
    )
    line = _one_line(_cli(toml))
    assert "wrong-secret-123" not in line
    if problem == "unreachable S3":
        assert "connection refused by http://127.0.0.1:1 (is the S3 server running?)" in line
    else:
        assert "request signature rejected (check the secret access key)" in line, line
    matrix.record(group="bad input", fault=problem, times=1, outcome="refused", check=line, ok=True)


# -- data problems: one run each on the shared SparkSession, fail policy ----------------------


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, key=b"s", value=value)
    producer.flush(30)


def _reading(value: Any) -> bytes:
    return f'{{"site": "s", "value": {value}}}'.encode()


def _run(kafka: Any, topic: str, work: Path) -> None:
    Pipeline(
        source=KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topics=[topic]),
        processor=CountReadings(),
        integrity=Integrity.strict(sequence_field="value"),
        sink=ParquetSink(str(work / "out")),
        checkpoint=str(work / "ck"),
        trigger="available-now",
        spark_master="local[2]",
        progress="quiet",
    ).run()


def _verified(work: Path) -> tuple[bool, str]:
    """``inorder verify --digests`` of what the runs in ``work`` committed (no Kafka)."""
    from inorder.ops.verify import verify

    report = verify(ParquetSink(str(work / "out")), None, digests=True)
    said = "clean" if report.ok else "NOT clean: " + "; ".join(report.lines()[:3])
    return report.ok, f"{report.batches} batch(es) committed before it, verify {said}"


#: name -> (the values of the topic's records, the message; ``{topic}`` is the topic).
DATA_CASES: dict[str, tuple[list[bytes], str]] = {
    "malformed value": (
        [_reading(0), b"{not json", _reading(1)],
        "undecodable at {topic}[0] offset 1 (key unknown): invalid JSON at byte 1",
    ),
    "wrong schema": (
        [_reading(0), _reading('"one"')],
        "undecodable at {topic}[0] offset 1 (key unknown): expected int for 'value', got str",
    ),
    "gap": (
        [_reading(0), _reading(1), _reading(3)],
        "sequence_gap at {topic}[0] offset 2 (key 's'): value 3 after 1",
    ),
    "repeat": (
        [_reading(0), _reading(1), _reading(1)],
        "sequence_repeat at {topic}[0] offset 2 (key 's'): value 1 after 1",
    ),
    # Under the strict tier a swap shows as the gap before it (the fuzzy tier reorders).
    "swap": (
        [_reading(0), _reading(2), _reading(1)],
        "sequence_gap at {topic}[0] offset 1 (key 's'): value 2 after 0",
    ),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_records_stop_with_a_named_error(
    kafka: Any, spark: Any, tmp_path: Path, matrix: Any, case: str
) -> None:
    values, expected = DATA_CASES[case]
    topic = kafka.new_topic()
    _produce(kafka.bootstrap_servers, topic, values)
    with pytest.raises(InorderError) as failed:
        _run(kafka, topic, tmp_path)
    line = str(failed.value)
    assert line == "integrity violation: " + expected.format(topic=topic), line
    matrix.record(
        group="bad input", fault=case, times=1, outcome="named error", check=line, ok=True
    )


def test_expired_offsets_and_deleted_topic(
    kafka: Any, spark: Any, tmp_path: Path, matrix: Any
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topic = kafka.new_topic()
    _produce(kafka.bootstrap_servers, topic, [_reading(i) for i in range(10)])
    _run(kafka, topic, tmp_path / "expired")
    _produce(kafka.bootstrap_servers, topic, [_reading(i) for i in range(10, 20)])
    for future in admin.delete_records([KafkaTopicPartition(topic, 0, 15)]).values():
        future.result(timeout=15)
    with pytest.raises(InorderError) as lost:
        _run(kafka, topic, tmp_path / "expired")
    line = str(lost.value)
    assert f"topic {topic!r} partition 0" in line and "source.fail_on_data_loss" in line, line
    proof_ok, proof = _verified(tmp_path / "expired")
    matrix.record(
        group="bad input",
        fault="expired offsets (below the log start)",
        times=1,
        outcome="named error",
        check=f"{line}; {proof}",
        ok=proof_ok,
    )
    assert proof_ok, proof

    gone = kafka.new_topic()
    _produce(kafka.bootstrap_servers, gone, [_reading(i) for i in range(5)])
    _run(kafka, gone, tmp_path / "deleted")
    admin.delete_topics([gone])[gone].result(timeout=15)
    with pytest.raises(InorderError) as deleted:
        _run(kafka, gone, tmp_path / "deleted")
    line = str(deleted.value)
    assert line == (
        f"subscribe: unknown topic(s) {gone} on {kafka.bootstrap_servers} (create them first, "
        "or use topic_pattern / subscribePattern, which picks topics up as they appear)"
    ), line
    proof_ok, proof = _verified(tmp_path / "deleted")
    matrix.record(
        group="bad input",
        fault="deleted topic",
        times=1,
        outcome="refused" if "exist" in line else "named error",
        check=f"{line}; {proof}",
        ok=proof_ok,
    )
    assert proof_ok, proof


class _StopOnNote(PlainReporter):
    """Plain progress that asks its run to stop once a note naming ``text`` is shown."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.notes: list[str] = []
        self.runner: PipelineRunner | None = None

    def info(self, text: str) -> None:
        super().info(text)
        self.notes.append(text)
        if self.text in text and self.runner is not None:
            self.runner.stop()


def test_pattern_matching_nothing_is_warned(
    kafka: Any, spark: Any, tmp_path: Path, matrix: Any
) -> None:
    # A query that keeps running may wait for its topics (under a trigger that ends, the same
    # pattern is refused: tests/e2e/test_start_checks.py).
    pattern = f"nothing-{random.randrange(10**9)}-.*"
    reporter = _StopOnNote(pattern)
    pipeline = Pipeline(
        source=KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topic_pattern=pattern),
        processor=CountReadings(),
        sink=ParquetSink(str(tmp_path / "out")),
        checkpoint=str(tmp_path / "ck"),
        trigger="1 second",
        spark_master="local[2]",
    )
    reporter.runner = PipelineRunner(pipeline, reporter=reporter, handle_signals=False)
    summary = reporter.runner.run()
    assert summary.records == 0
    warnings = [line for line in reporter.notes if pattern in line]
    assert len(warnings) == 1, reporter.notes
    assert warnings[0].startswith(f"inorder: warning: topic_pattern {pattern!r} matches no topic")
    matrix.record(
        group="bad input",
        fault="topic_pattern matching no topic",
        times=1,
        outcome="policy action",
        check=warnings[0],
        ok=True,
    )
