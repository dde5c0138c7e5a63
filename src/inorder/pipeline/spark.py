"""Building the SparkSession inorder runs on, with the settings its engine relies on."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from inorder.pipeline import class_archive, spark_home

#: JVM options of a local master's driver (which is also its executor): the JIT's first tier
#: only and the serial collector. With the engine reading Kafka in Python, the JVM of a local
#: job mostly plans and starts queries, and C2 compiling Spark's start-up paths on two cores
#: cost more CPU than it saved (a session with one small job: 16-17 s of CPU with the
#: defaults, 9-11 s with these). ``spark.driver.extraJavaOptions`` in ``conf`` replaces them.
LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def build_spark_session(
    master: str = "local[*]",
    app_name: str = "inorder",
    conf: Mapping[str, str] | None = None,
    local_dir: str | None = None,
    log_file: str | None = None,
    *,
    with_sources: bool = True,
    before_launch: Callable[[], None] | None = None,
) -> Any:
    """Create (or get) the SparkSession, with inorder's data source registered.

    Sets ``PYSPARK_PYTHON`` to this interpreter unless already set: workers that start another
    python (without pyarrow) fail with nothing but "Python worker failed to connect back".

    Python workers are forked from inorder's daemon (``spark.python.daemon.module`` =
    ``inorder.spark.daemon``, see :func:`daemon_module_default`), which imports PySpark, pyarrow
    and inorder's engine once instead of in every new worker. ``conf`` overrides every
    default here, that one included (``pyspark.daemon`` is PySpark's own).

    Spark's own log (warnings, errors, JVM stack traces) goes to ``log_file`` (default: a
    file in the temporary directory), not to the terminal: the runner reports failures in
    one line that names the file. Applies when this call starts the JVM.

    ``before_launch`` is called once the Python-side preparation is done, just before the JVM
    is launched (or the existing session is taken): :class:`EarlySession` waits for it.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # Local runs listen on loopback only (and skip the "hostname resolves to a loopback
        # address" warning).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        spark_home.use_compiled_pyspark(conf or {})
    from pyspark.sql import SparkSession

    log_config = Path(__file__).with_name("log4j2.properties")
    executor_log_config = Path(__file__).with_name("log4j2-executor.properties")
    driver_options = f"-Dlog4j2.configurationFile={log_config}"
    if master.startswith("local"):
        driver_options += " " + LOCAL_JVM_OPTIONS
        archive_options = class_archive.java_options(LOCAL_JVM_OPTIONS)
        if archive_options:
            driver_options += " " + archive_options
    if log_file:
        driver_options += f" -Dinorder.logFile={log_file}"

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": driver_options,
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={executor_log_config}",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.encodingFormat": "avro",
    }
    daemon = daemon_module_default(master, conf or {})
    if daemon is not None:
        settings[DAEMON_MODULE_KEY] = daemon
    if local_dir:
        settings["spark.local.dir"] = local_dir
    settings.update((conf or {}).items())
    from pyspark.java_gateway import launch_gateway  # noqa: F401 - imported before the launch

    if before_launch is not None:
        before_launch()
    if log_file:
        _start_context_logging_to(log_file, master, app_name, settings)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if with_sources:
        register_sources(session)
    return session


DAEMON_MODULE_KEY = "spark.python.daemon.module"


def _start_context_logging_to(
    log_file: str, master: str, app_name: str, settings: Mapping[str, str]
) -> None:
    """Start the JVM with its standard error appended to ``log_file``, if this call starts it.

    The JVM writes some lines to standard error itself, not through log4j (Java's "Using
    incubator modules" warning at every start, the Python workers' output it relays); on the
    terminal they would sit among inorder's progress lines, and a run refused by a pre-flight
    check while the session was starting (:class:`EarlySession`) would print more than its one
    line. PySpark's ``launch_gateway`` takes the ``Popen`` arguments for exactly this. When a
    SparkContext exists or its JVM was started by ``spark-submit``, nothing changes.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._active_spark_context is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    try:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        stderr = open(log_file, "ab")  # noqa: SIM115 - the JVM holds its own descriptor
    except OSError:
        return  # then the JVM's standard error stays the terminal, as PySpark's default
    with stderr:
        conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(settings.items()))
        gateway = launch_gateway(conf, popen_kwargs={"stderr": stderr})  # type: ignore[no-untyped-call]
    SparkContext(conf=conf, gateway=gateway)


#: The worker daemon module inorder sets by default.
INORDER_DAEMON = "inorder.spark.daemon"


def daemon_module_default(master: str, conf: Mapping[str, str]) -> str | None:
    """The daemon module to set, or ``None`` to leave Spark's default (``pyspark.daemon``).

    Spark starts the daemon as ``<executor python> -m <module>`` before any task runs, so
    the module must be importable by the executors' interpreter, not merely shipped with the
    job. It is not set when ``conf`` already names one, when the package is shipped as
    ``--py-files``/``spark.submit.pyFiles`` (not on the daemon's path), or, on a local
    master (executors on this machine), when the executors' python is another interpreter
    that cannot import it. Executors of remote clusters run inorder's code anyway (its data
    source and engine), so there the package is assumed installed (the environment archive
    or an image); ``spark.python.daemon.module=pyspark.daemon`` turns it off.
    """
    if DAEMON_MODULE_KEY in conf or conf.get("spark.submit.pyFiles"):
        return None
    if master.startswith("local"):
        python = conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
        if python and not _python_imports_daemon(python):
            return None
    return INORDER_DAEMON


@functools.lru_cache(maxsize=8)
def _python_imports_daemon(python: str) -> bool:
    """Whether ``python`` can import the daemon module (this interpreter: yes)."""
    try:
        if os.path.realpath(python) == os.path.realpath(sys.executable):
            return True
        done = subprocess.run(
            [
                python,
                "-c",
                f"import importlib.util as u; u.find_spec({INORDER_DAEMON!r}) or exit(1)",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def register_sources(session: Any) -> None:
    """Register inorder's data sources (``inorder-kafka``) with ``session``."""
    try:
        from inorder.kafka.source import KafkaDataSource
    except ImportError:  # the source module is optional while the package is being built
        return
    from inorder.spark.worker_pools import in_pool

    with in_pool(session, None):  # Spark's default pool, never the engine's
        session.dataSource.register(KafkaDataSource)


#: The longest :meth:`EarlySession.start` waits for the preparation (then it goes on anyway).
_PREPARE_TIMEOUT_S = 10.0


class EarlySession(threading.Thread):
    """:func:`build_spark_session` started in the background, beside the pre-flight checks.

    Creating the session (launching the JVM, loading Spark, the SparkContext) takes seconds
    and needs none of the checks' results, so ``inorder run`` starts it first and the checks
    run meanwhile on the other core; :meth:`session` waits for it. A check that fails still
    ends the run before anything is read: the session is then simply not used (its JVM exits
    with the process). The data source is registered by :meth:`session`, in the caller's
    thread, so its modules are not imported by two threads at once.
    """

    def __init__(self, **session_options: Any) -> None:
        super().__init__(name="inorder-spark-start", daemon=True)
        #: The arguments of :func:`build_spark_session` this session was created with.
        self.options = session_options
        self._session: Any = None
        self._error: BaseException | None = None
        self._launching = threading.Event()

    def start(self) -> None:
        """Start, and return once the JVM is being launched.

        The preparation before the launch (importing PySpark, the settings) is Python work:
        beside the caller's own imports it would share the interpreter lock and launch the JVM
        late. Waiting for it lets the JVM start at once; the rest of the wait is the JVM's.
        """
        super().start()
        self._launching.wait(timeout=_PREPARE_TIMEOUT_S)

    def run(self) -> None:
        """Create the session (without registering sources); keep the result or the error."""
        try:
            self._session = build_spark_session(
                **self.options, with_sources=False, before_launch=self._launching.set
            )
        except BaseException as exc:  # re-raised in the caller's thread by session()
            self._error = exc
        finally:
            self._launching.set()

    def session(self) -> Any:
        """The session once created, with inorder's sources registered; or its error."""
        self.join()
        if self._error is not None:
            raise self._error
        register_sources(self._session)
        return self._session


class WorkerWarmUp(threading.Thread):
    """The background job of :func:`warm_python_workers`; ``error`` holds what stopped it."""

    def __init__(self, session: Any, pools: tuple[str | None, ...] = (None,)) -> None:
        super().__init__(name="inorder-warm-workers", daemon=True)
        self.session = session
        self.pools = pools
        self.error: Exception | None = None

    def run(self) -> None:
        """One task per core and pool, doing nothing, the pools' first tasks side by side."""
        from inorder.spark.worker_pools import in_pool

        try:
            slots = max(int(self.session.sparkContext.defaultParallelism), 1)
            plans = []
            for _ in range(slots):  # interleaved: each pool's daemon starts in the first wave
                for pool in self.pools:
                    with in_pool(self.session, pool):
                        plans.append(self.session.range(1).mapInArrow(_nothing, "id long"))
            job = plans[0]
            for plan in plans[1:]:
                job = job.union(plan)
            job.collect()
        except Exception as exc:  # the session stopped first, or no SparkContext: nothing lost
            self.error = exc


def warm_python_workers(
    session: Any, master: str, pools: tuple[str | None, ...] = (None,)
) -> WorkerWarmUp | None:
    """On a local master, start the Python worker daemons and workers in the background.

    Spark starts a pool's daemon (which imports PySpark, pyarrow and inorder's engine) at the
    first Python task, i.e. inside the first micro-batch, after the data source's planner
    processes have run one after another. One job with a task per core and pool in ``pools``
    (``None``: Spark's default pool; the partition backend's engine and the source's reads of
    marker rows have their own, :mod:`inorder.spark.worker_pools`), started beside them,
    brings the daemons and workers up in parallel, and the first batch reuses them. A
    failure is only recorded: the first batch then starts them itself, as without this.
    """
    if not master.startswith("local"):
        return None
    warm_up = WorkerWarmUp(session, pools)
    warm_up.start()
    return warm_up


def _nothing(batches: Iterator[Any]) -> Iterator[Any]:
    for _ in batches:
        pass
    return iter(())
