"""A failed query's JVM message becomes one line naming inorder's own error.

The unwritable cases quote messages provoked on this project's machines: Spark 4.3's offsets
and commits logs and its state stores (HDFS-backed, RocksDB) on a filled or read-only-remounted
tmpfs, pyarrow, deltalake (object_store) and pyiceberg writing to one, and inorder's own
writers. "Disk quota exceeded" is the same shapes with EDQUOT's words: the test kernel has no
quota support to provoke it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from inorder.errors import (
    BrokerUnavailable,
    ConfigError,
    DataLossError,
    InorderError,
    SinkError,
    StorageError,
)
from inorder.pipeline.failures import explain_exception, explain_failure, find_unwritable

SOURCE_FAILURE = """[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming \
data source perform latestOffset: Traceback (most recent call last):
  File "/x/pyspark/sql/streaming/python_streaming_source_runner.py", line 281, in main
  File "/x/inorder/kafka/source.py", line 222, in latestOffset
    raise DataLossError(event.message())
inorder.errors.DataLossError: data loss in topic 't' partition 0: expected offset 100 but \
the earliest available offset is 150
 SQLSTATE: 38000
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.pythonStreamingDataSourceRuntimeError(x)
"""

TASK_FAILURE = """Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times, most \
recent failure: Lost task 0.0: org.apache.spark.api.python.PythonException: Traceback (most \
recent call last):
  File "/x/inorder/engine/task.py", line 10, in run
ValueError: bad thing happened
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(x)
"""

CONCURRENT = """[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple \
streaming jobs detected for 3.
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.concurrentStreamLogUpdate(x)
"""


def test_inorder_error_inside_a_jvm_trace_is_the_line() -> None:
    error = explain_failure(SOURCE_FAILURE, "ck", "ck/inorder-run.log")
    assert isinstance(error, DataLossError)
    assert str(error).startswith("data loss in topic 't' partition 0: expected offset 100")
    assert str(error).endswith("(full trace in ck/inorder-run.log)")
    assert "\n" not in str(error)


BROKER_GONE = SOURCE_FAILURE.replace(
    "    raise DataLossError(event.message())\ninorder.errors.DataLossError: data loss in topic "
    "'t' partition 0: expected offset 100 but the earliest available offset is 150",
    "    raise self._unreachable(exc) from None\ninorder.kafka.admin.BrokerUnreachable: "
    "kafka.bootstrap.servers=127.0.0.1:9: no broker answered within 30 s (timed out)",
)


def test_an_unreachable_broker_mid_run_is_named_not_the_trace() -> None:
    # Its class is named for what happened, not "...Error": it was missed, and the user got
    # "query failed: Failed when Python streaming data source perform latestOffset: Traceback".
    assert "BrokerUnreachable" in BROKER_GONE
    error = explain_failure(BROKER_GONE, "ck", "ck/inorder-run.log")
    # A broker failure (exit 1), not a wrong setting (exit 2): it answered at the start.
    assert isinstance(error, BrokerUnavailable) and error.exit_code == 1
    assert str(error).startswith(
        "kafka.bootstrap.servers=127.0.0.1:9: no broker answered within 30 s (timed out); "
        "the batch being planned was not committed"
    ), str(error)
    assert "Traceback" not in str(error)


def test_other_python_error_keeps_its_type() -> None:
    error = explain_failure(TASK_FAILURE, "ck")
    assert type(error) is InorderError
    assert str(error) == "ValueError: bad thing happened"


def test_concurrent_copies_are_named() -> None:
    error = explain_failure(CONCURRENT, "s3://b/ck", "/tmp/x.log")
    assert isinstance(error, ConfigError)
    assert "another run of this pipeline is writing checkpoint s3://b/ck" in str(error)


def test_unknown_failure_keeps_the_first_line_without_the_error_class() -> None:
    error = explain_failure("[SOME_SPARK_ERROR] it broke\n\tat org.apache.X", "ck")
    assert str(error) == "query failed: it broke"


WORKER_DIED = """An error occurred while calling o123.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 7.0 \
failed 1 times, most recent failure: Lost task 1.0 in stage 7.0 (TID 15): \
org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider \
setting 'spark.sql.execution.pyspark.udf.faulthandler.enabled' or \
'spark.python.worker.faulthandler.enabled' configuration to 'true' for the better Python \
traceback.
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1.applyOrElse(x)
Caused by: java.io.EOFException
"""


def test_a_dead_python_worker_is_named_not_the_py4j_wrapper() -> None:
    error = explain_failure(WORKER_DIED, "ck", "/tmp/run.log")
    assert type(error) is InorderError
    assert str(error).startswith("a Spark Python worker died while running this batch's tasks")
    assert "resumes exactly (full trace in /tmp/run.log)" in str(error)
    assert "Py4J" not in str(error)


DISK_FULL = """Job aborted due to stage failure: org.apache.spark.api.python.PythonException: \
Traceback (most recent call last):
  File "/x/inorder/storage/fs.py", line 349, in write_bytes
OSError: [Errno 28] No space left on device: '/ck/engine/batches/00000000000000000001.json'
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(x)
"""


def test_a_full_disk_names_the_file_and_that_nothing_was_committed() -> None:
    error = explain_failure(DISK_FULL, "ck", "ck/inorder-run.log")
    assert isinstance(error, StorageError)
    assert str(error) == (
        "cannot write /ck/engine/batches/00000000000000000001.json: No space left on device; "
        "the batch was not committed: free space on that filesystem, then run again (it "
        "resumes exactly) (full trace in ck/inorder-run.log)"
    )
    # Other operating-system errors keep their own words.
    other = DISK_FULL.replace("[Errno 28] No space left on device", "[Errno 2] No such file")
    assert str(explain_failure(other, "ck")).startswith("OSError: [Errno 2] No such file: ")


def test_a_denied_read_is_not_called_a_write() -> None:
    denied = DISK_FULL.replace("[Errno 28] No space left on device", "[Errno 13] Permission denied")
    assert str(explain_failure(denied, "ck")).startswith("OSError: [Errno 13] Permission denied: ")


# -- a full, over-quota or read-only location, whichever writer met it ------------------------

CK = "/data/ck"
#: Spark 4.3's query exception when its offsets or commits log met a full disk: no file named.
JVM_NO_SPACE = """[STREAM_FAILED] Query outages [id = dca83dac-ad29-44e9-8847-066a6b75bea9, \
runId = 42f0595c-63a0-4348-9c6b-2c6ffab73cc7] terminated with exception: java.io.IOException: \
No space left on device SQLSTATE: XXKST
=== Streaming Query ===
Identifier: outages [id = dca83dac-ad29-44e9-8847-066a6b75bea9, runId = 42f0595c]
Logical Plan:
~WriteToMicroBatchDataSourceV1 ForeachBatchSink, [checkpointLocation=/data/ck/spark], Append
"""
#: Spark's packages in the frames below.
SQL = "org.apache.spark.sql.execution.streaming"
HADOOP = "org.apache.hadoop.fs"


def frames(*calls: str) -> str:
    return "".join(f"\tat {call}\n" for call in calls)


#: The run log's record of it (``%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex``), frames trimmed;
#: ``{writer}`` is the frame that tells which log was written.
LOG_RECORD = (
    "26/11/26 10:39:51 ERROR MicroBatchExecution: Query outages [id = dca83dac] terminated "
    "with error\n"
    f"{HADOOP}.FSError: java.io.IOException: No space left on device\n"
    + frames(
        f"{HADOOP}.RawLocalFileSystem$LocalFSFileOutputStream.write(RawLocalFileSystem.java:549)",
        f"{SQL}.checkpointing.CheckpointFileManager$RenameBasedFSDataOutputStream.close(x:158)",
        f"{SQL}.checkpointing.HDFSMetadataLog.write(HDFSMetadataLog.scala:211)",
        f"{SQL}.checkpointing.HDFSMetadataLog.add(HDFSMetadataLog.scala:137)",
        f"{SQL}.runtime.MicroBatchExecution.{{writer}}(MicroBatchExecution.scala:1453)",
        f"{SQL}.runtime.StreamExecution$$anon$1.run(StreamExecution.scala:236)",
    )
    + "Caused by: java.io.IOException: No space left on device\n"
    + frames("java.base/java.io.FileOutputStream.writeBytes(Native Method)")
    + "\t... 36 more\n"
)


def run_log(tmp_path: Path, *records: str) -> str:
    path = tmp_path / "inorder-run.log"
    start = "26/11/26 10:39:44 WARN NativeCodeLoader: Unable to load native-hadoop library\n"
    path.write_text(start + "".join(records) + "26/11/26 10:39:53 WARN Other: later\n")
    return str(path)


@pytest.mark.parametrize(
    ("writer", "folder", "what"),
    [
        ("markMicroBatchStart", "offsets", "Spark's offsets log"),
        ("markMicroBatchEnd", "commits", "Spark's commits log"),
    ],
)
def test_spark_log_write_names_the_log_by_the_run_logs_frames(
    writer: str, folder: str, what: str, tmp_path: Path
) -> None:
    log = run_log(tmp_path, LOG_RECORD.replace("{writer}", writer))
    error = explain_failure(JVM_NO_SPACE, CK, log)
    assert isinstance(error, StorageError)
    assert str(error) == (
        f"cannot write {CK}/spark/{folder} ({what}): No space left on device; the batch was not "
        "committed: free space on that filesystem, then run again (it resumes exactly) "
        f"(full trace in {log})"
    )


def test_spark_write_without_a_log_names_sparks_checkpoint_folder(tmp_path: Path) -> None:
    # The run log sits on the full disk too (or is elsewhere): nothing names the file.
    for log in (None, str(tmp_path / "missing.log"), run_log(tmp_path)):
        error = str(explain_failure(JVM_NO_SPACE, CK, log))
        assert error.startswith(
            f"cannot write {CK}/spark (Spark's checkpoint): No space left on device; the batch "
            "was not committed: free space on that filesystem, then run again"
        )
        assert "\n" not in error


def test_the_log_record_with_the_trace_wins_over_a_later_repeat(tmp_path: Path) -> None:
    later = "26/11/26 10:39:52 WARN Something: java.io.IOException: No space left on device\n"
    log = run_log(tmp_path, LOG_RECORD.replace("{writer}", "markMicroBatchEnd"), later)
    assert "(Spark's commits log)" in str(explain_failure(JVM_NO_SPACE, CK, log))


def test_a_read_only_spark_log_names_the_batch_file_not_its_temporary_file() -> None:
    text = (
        "[STREAM_FAILED] Query [id = c88372a8, runId = 97da8598] terminated with exception: "
        f"{CK}/spark/offsets/.2.a6aab7cd-558e-43ee-b451-7a5167f3c6bd.tmp (Read-only file system) "
        "SQLSTATE: XXKST\n=== Streaming Query ===\n"
    )
    assert str(explain_failure(text, CK)) == (
        f"cannot write {CK}/spark/offsets/2 (Spark's offsets log): Read-only file system; the "
        "batch was not committed: make it writable (it is mounted read-only), then run again "
        "(it resumes exactly)"
    )


#: A RocksDB state store's commit on a full disk, through the batch function (Py4JJavaError).
STATE_STORE = (
    "Py4JJavaError: An error occurred while calling o62.count.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 5.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 5.0 (TID 4) (192.0.2.2 "
    "executor driver): org.apache.spark.SparkException: [CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT] "
    "Error writing state store files for provider RocksDBStateStore[stateStoreId=StateStoreId[ "
    "operatorId=0, partitionId=0, storeName=default ], version=2]. Cannot perform commit during "
    "state checkpoint. SQLSTATE: 58030\n"
    + frames("org.apache.spark.sql.errors.QueryExecutionErrors$.failedToCommitStateFileError(x)")
    + f"Caused by: {HADOOP}.FSError: java.io.IOException: No space left on device\n"
    + frames(
        f"{HADOOP}.RawLocalFileSystem$LocalFSFileOutputStream.write(RawLocalFileSystem.java:549)",
        f"{HADOOP}.FileUtil.copy(FileUtil.java:432)",
    )
    + "Caused by: java.io.IOException: No space left on device\n"
)


def test_spark_state_store_on_a_full_disk_is_named() -> None:
    error = str(explain_failure(STATE_STORE, CK))
    assert error.startswith(
        f"cannot write {CK}/spark/state (Spark's state store): No space left on device; the "
        "batch was not committed"
    )
    assert "Py4J" not in error


def test_spark_state_store_on_a_read_only_disk_names_the_file() -> None:
    sst = f"{CK}/spark/state/0/0/SSTs/000009-ff29466f-29f5-4f58-9467-ea02d21579fa.sst"
    text = STATE_STORE.replace(
        f"Caused by: {HADOOP}.FSError: java.io.IOException: No space left on device",
        f"Caused by: java.io.FileNotFoundException: {sst} (Read-only file system)",
    ).replace("Caused by: java.io.IOException: No space left on device\n", "")
    assert str(explain_failure(text, CK)).startswith(
        f"cannot write {sst} (Spark's state store): Read-only file system; the batch was not "
        "committed: make it writable (it is mounted read-only), then run again"
    )


def test_over_quota_asks_for_quota() -> None:
    text = JVM_NO_SPACE.replace("No space left on device", "Disk quota exceeded")
    assert str(explain_failure(text, CK)) == (
        f"cannot write {CK}/spark (Spark's checkpoint): Disk quota exceeded; the batch was not "
        "committed: raise the disk quota or free space, then run again (it resumes exactly)"
    )


def python_task_failure(*lines: str) -> str:
    """A Python worker's trace inside Spark's task failure (as in ``TASK_FAILURE``)."""
    return (
        "Job aborted due to stage failure: Lost task 0.0: "
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/venv/inorder/engine/task.py", line 188, in finish\n'
        + "".join(f"{line}\n" for line in lines)
        + frames("org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePython(x)")
    )


@pytest.mark.parametrize(
    ("message", "named"),
    [
        # inorder's state write (inorder.state.checkpoint), already naming its file.
        (
            "inorder.errors.StorageError: cannot write state file "
            f"{CK}/engine/state/t-000/1/00000000000000000002.delta.arrow.zstd: No space left on "
            "device; the batch was not committed: run again once the checkpoint location is "
            "writable",
            f"{CK}/engine/state/t-000/1/00000000000000000002.delta.arrow.zstd (inorder's state)",
        ),
        # inorder's Parquet staging: pyarrow's words after the file.
        (
            "inorder.errors.StorageError: cannot write staged file /out/_inorder/staging/2/"
            "t-000-1-54944b62ae52/topic=t-000/part-00000.parquet.staged: [Errno 28] Error "
            "writing bytes to file. Detail: [errno 28] No space left on device; the batch was "
            "not committed: run again once the location is writable",
            "/out/_inorder/staging/2/t-000-1-54944b62ae52/topic=t-000/part-00000.parquet.staged",
        ),
        # inorder.storage.fs.write_bytes: open() of its temporary file was refused.
        (
            f"OSError: [Errno 30] Read-only file system: '{CK}/engine/batches/.tmp-"
            "0f3c9a1b2c3d4e5f60718293a4b5c6d7'",
            f"{CK}/engine/batches (inorder's state)",
        ),
        # pyarrow (Parquet, Iceberg's data files) opening a file.
        (
            "OSError: [Errno 28] Failed to open local file '/out/a.parquet'. Detail: [errno 28] "
            "No space left on device",
            "/out/a.parquet",
        ),
        # pyiceberg creating its warehouse folder through pyarrow.
        (
            "OSError: [Errno 30] Cannot create directory '/out/wh'. Detail: [errno 30] "
            "Read-only file system",
            "/out/wh",
        ),
        # deltalake (object_store) creating the table's folder.
        (
            "_internal.TableNotFoundError: Could not create local directory: /out/delta\n"
            'Error: Os { code: 28, kind: StorageFull, message: "No space left on device" }',
            "/out/delta",
        ),
        # deltalake writing a data file (the file carries object_store's "#1" suffix).
        (
            "_internal.DeltaError: Failed to parse parquet: External: Generic LocalFileSystem "
            "error: Unable to open file /out/delta/part-00000-f3e64f3c-19a7-49b4-bdb1-"
            "315fde3669ed-c000.snappy.parquet#1: Read-only file system (os error 30)",
            "/out/delta/part-00000-f3e64f3c-19a7-49b4-bdb1-315fde3669ed-c000.snappy.parquet",
        ),
    ],
)
def test_python_writers_name_the_file(message: str, named: str) -> None:
    error = str(explain_failure(python_task_failure(message), CK, "/l.log"))
    assert error.startswith(f"cannot write {named}: "), error
    assert "; the batch was not committed: " in error
    assert error.endswith("then run again (it resumes exactly) (full trace in /l.log)")
    assert "\n" not in error and "Errno" not in error and "Detail" not in error


def test_a_python_write_naming_no_file_names_its_writer_by_the_innermost_frame() -> None:
    # pyarrow's write() names no file; the sink's frame is inside the engine task's.
    text = python_task_failure(
        '  File "/venv/inorder/sinks/parquet_writer.py", line 150, in _flush',
        '  File "/venv/pyarrow/parquet/core.py", line 1134, in write_table',
        "OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on "
        "device",
    )
    assert str(explain_failure(text, CK)).startswith(
        "cannot write the pipeline's output: No space left on device; the batch was not "
        "committed: free space on that filesystem"
    )
    unknown = "ValueError: x\nOSError: [Errno 28] No space left on device"
    found = find_unwritable(unknown, CK)
    assert found is not None and "the error names none: see the log" in found.line()


def test_delta_commit_in_the_driver_keeps_the_reason_a_sink_error_cut_off() -> None:
    # object_store's cause chain (colours included) under a SinkError raised `from None`.
    cause = OSError(
        "Generic LocalFileSystem error\n          \x1b[31m↳\x1b[0m Unable to open file "
        "/out/delta/_delta_log/00000000000000000001.json#1\n           \x1b[31m↳\x1b[0m "
        "Read-only file system (os error 30)"
    )
    try:
        try:
            raise cause
        except OSError:
            raise SinkError(
                "/out/delta: commit of batch 1 failed: Generic LocalFileSystem error"
            ) from None
    except SinkError as exc:
        error = explain_exception(exc, CK, "/l.log")
    assert str(error) == (
        "cannot write /out/delta/_delta_log/00000000000000000001.json: Read-only file system; "
        "the batch was not committed: make it writable (it is mounted read-only), then run "
        "again (it resumes exactly) (full trace in /l.log)"
    )
    # Without a refused write the inorder error stays itself, and others are explained.
    plain = SinkError("/out/delta: cannot open Delta table: not a table")
    assert explain_exception(plain, CK) is plain
    assert str(explain_exception(ValueError("bad"), CK)) == "ValueError: bad"


def test_a_file_uri_checkpoint_still_names_its_parts() -> None:
    text = python_task_failure(f"OSError: [Errno 28] No space left on device: '{CK}/engine/x'")
    assert "(inorder's state)" in str(explain_failure(text, f"file://{CK}/"))
    text = python_task_failure("OSError: [Errno 28] No space left on device: '/elsewhere/x'")
    assert str(explain_failure(text, CK)).startswith("cannot write /elsewhere/x: No space")


def test_the_unwritable_line_never_carries_credentials() -> None:
    text = (
        "java.io.IOException: https://AKIAEXAMPLE:s3cr3t@store.example/bucket/k: No space left "
        "on device"
    )
    error = str(explain_failure(text, CK))
    assert error.startswith("cannot write /data/ck/spark (Spark's checkpoint): No space")
    assert "s3cr3t" not in error and "AKIAEXAMPLE" not in error


def test_other_write_errors_are_not_unwritable_locations() -> None:
    for words in ("Permission denied", "Input/output error", "No such file or directory"):
        text = JVM_NO_SPACE.replace("No space left on device", words)
        assert find_unwritable(text, CK) is None
        assert "batch was not committed" not in str(explain_failure(text, CK))
