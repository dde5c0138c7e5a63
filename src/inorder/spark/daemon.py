"""The Python worker daemon inorder's Spark sessions use (``spark.python.daemon.module``).

Spark starts one daemon per executor (and worker module) and asks it to ``fork()`` a Python
worker whenever a task needs one and no idle worker is left. PySpark's own daemon forks
before importing anything, so every new worker imports PySpark from ``pyspark.zip`` (no
bytecode cache: the whole of ``pyspark.sql`` is compiled from source, 1-2 s of CPU per worker
on this project's machines), then pyarrow, pandas and inorder's engine on its first task.

This module imports all of that once, in the daemon, then runs PySpark's own daemon loop
unchanged: forked workers start with the modules already loaded (copy-on-write), and the
objects alive at that point are moved to the permanent GC generation so that neither the
collections in workers nor reference counting copy those pages more than needed.

Anything that fails to import is skipped (the worker imports it itself later, as without
this module); a failure here never stops the daemon. ``INORDER_DAEMON_PRELOAD`` (a
comma-separated list of module names, e.g. a processor's module, passed to executors with
``spark.executorEnv.INORDER_DAEMON_PRELOAD``) adds modules; ``INORDER_DAEMON_PRELOAD=none``
turns preloading off. The daemon protocol uses stdout (the port number): output printed while
preloading is sent to stderr instead.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Iterator

#: Modules imported before the first fork, in this order. PySpark's worker and the Arrow
#: serializers first (the bulk of a worker's start-up), then what inorder's tasks import.
PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.worker.plan_data_source_read",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.parquet",
    "pandas",
    "confluent_kafka",
    "msgspec",
    "rocksdict",
    "inorder.kafka.source",
    "inorder.kafka.consumer",
    "inorder.engine.task",
    "inorder.engine.partition",
    "inorder.schema",
    "inorder.state.codec",
    "inorder.sinks.parquet",
)

#: What the ``source`` pool's daemon preloads (:mod:`inorder.spark.worker_pools`): its workers
#: only run the source's read of marker rows (no Parquet, Kafka client, state or engine).
#: pandas stays: pyarrow imports it at the first ``pa.array`` of a process.
SOURCE_PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "pyspark.sql.worker.plan_data_source_read",
    "pyarrow",
    "pandas",
    "inorder.kafka.source",
    "inorder.kafka.consumer",  # the marker rows (the source imports it where it reads)
)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Route fd 1 to fd 2: the daemon's stdout carries its port number to the JVM."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def preload_modules() -> list[str]:
    """Import :data:`PRELOAD` (:data:`SOURCE_PRELOAD` in the ``source`` worker pool) plus
    ``$INORDER_DAEMON_PRELOAD``; the names that failed."""
    extra = os.environ.get("INORDER_DAEMON_PRELOAD", "").strip()
    if extra.lower() == "none":
        return []
    from inorder.spark.worker_pools import POOL_ENV, SOURCE_POOL  # stdlib only: cheap

    base = SOURCE_PRELOAD if os.environ.get(POOL_ENV) == SOURCE_POOL else PRELOAD
    names = [*base, *(n.strip() for n in extra.split(",") if n.strip())]
    failed: list[str] = []
    import importlib

    with _stdout_to_stderr():
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # a worker imports what it needs itself
                failed.append(name)
    _drop_jars_without_python()
    _forget_zip_subimporters()
    # Drop garbage made while importing, then exclude what is left from later collections
    # (in the daemon and in every forked worker).
    gc.collect()
    gc.freeze()
    return failed


def _drop_jars_without_python() -> None:
    """Take jar files that hold no Python module off ``sys.path`` (Spark's core jar).

    Spark puts the jar of its Python bridge on every Python process's ``PYTHONPATH``, so each
    import searches it and a worker's first task re-reads its whole directory
    (``importlib.invalidate_caches()``: 26-36 ms on Python 3.11 and 3.12 for the 6,000 entries
    of ``spark-core``, measured). A jar with no ``.py``/``.pyc`` file can never provide a module.
    """
    import zipfile
    import zipimport

    for entry in [e for e in sys.path if e.endswith(".jar")]:
        try:
            with zipfile.ZipFile(entry) as jar:
                if any(n.endswith((".py", ".pyc")) for n in jar.namelist()):
                    continue
        except (OSError, zipfile.BadZipFile):
            continue
        while entry in sys.path:
            sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)
        zipimport._zip_directory_cache.pop(entry, None)  # type: ignore[attr-defined]


def _forget_zip_subimporters() -> None:
    """Drop cached importers of package directories inside zip files (``pyspark.zip``).

    A worker's first task adds Spark's files directory to ``sys.path`` and calls
    ``importlib.invalidate_caches()``, which makes *every* cached zip importer re-read its
    archive's directory: after preloading PySpark that is one per imported sub-package
    (measured: 17 importers, 0.26 s per worker; 0.01 s without them). They are rebuilt on
    demand from the archive directory already in memory.
    """
    import zipimport

    on_path = set(sys.path)
    for key, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, zipimport.zipimporter) and key not in on_path:
            del sys.path_importer_cache[key]


def main() -> None:
    """Preload, then run PySpark's daemon loop (it reads its arguments from ``sys.argv``)."""
    started = time.perf_counter()
    try:
        failed = preload_modules()
    except Exception as exc:  # never keep Spark from getting workers
        print(f"inorder daemon: preloading failed: {exc!r}", file=sys.stderr)
    else:
        if os.environ.get("INORDER_DAEMON_VERBOSE"):
            print(
                f"inorder daemon: preloaded in {time.perf_counter() - started:.2f} s"
                + (f"; not importable: {', '.join(failed)}" if failed else ""),
                file=sys.stderr,
            )
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
