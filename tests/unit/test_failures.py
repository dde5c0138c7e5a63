"""A failed query's JVM message becomes one line naming inorder's own error."""

from __future__ import annotations

from inorder.errors import ConfigError, DataLossError, InorderError
from inorder.pipeline.failures import explain_failure

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
    error = str(explain_failure(DISK_FULL, "ck", "ck/inorder-run.log"))
    assert error == (
        "cannot write /ck/engine/batches/00000000000000000001.json: No space left on device; "
        "the batch was not committed: run again once the location is writable (it resumes "
        "exactly) (full trace in ck/inorder-run.log)"
    )
    # Other operating-system errors keep their own words.
    other = DISK_FULL.replace("[Errno 28] No space left on device", "[Errno 2] No such file")
    assert str(explain_failure(other, "ck")).startswith("OSError: [Errno 2] No such file: ")


def test_a_denied_read_is_not_called_a_write() -> None:
    denied = DISK_FULL.replace("[Errno 28] No space left on device", "[Errno 13] Permission denied")
    assert str(explain_failure(denied, "ck")).startswith("OSError: [Errno 13] Permission denied: ")
