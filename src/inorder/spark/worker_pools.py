"""The engine's Python workers in a pool of their own, apart from the source's.

Spark keeps one pool of Python worker processes (one daemon and its idle workers) per
combination of Python executable, worker and daemon modules and *environment variables* of the
Python function a task runs. A task of the partition backend needs two workers at once: one
runs the ``inorder-kafka`` source's read (the marker rows of its ranges), the other the engine
(``mapInArrow``). In one shared pool the idle workers are handed out in the order they were
released, and the source's read finishes before the engine, so a process that ran the engine in
one batch ran the source's read in the next about half the time. The engine's state caches
(:mod:`inorder.state.registry`) are per process: its next task opened and rebuilt the caches in
another process, and four processes each held a copy (measured on ``local[2]``: 0-6 of 12
topic-partitions per batch found their cache open).

The engine's ``mapInArrow`` function is created with ``INORDER_WORKER_POOL=engine`` in its
environment (:func:`engine_pool`), which gives it a pool of its own: an engine task always lands in
a process that ran engine tasks, and with stable range groups
(:func:`inorder.kafka.input_partitions.group_ranges`) mostly in the one that ran the same
topic-partitions the batch before. When the engine reads Kafka itself, the source's reads only ship
marker rows and run in the ``source`` pool, whose daemon preloads PySpark's worker, pyarrow,
pandas, the source and its marker rows' builder (0.7 s of CPU here) instead of everything the
engine needs (1.0 s): a second daemon per executor, started beside the first at start-up
(:func:`inorder.pipeline.spark.warm_python_workers`).

PySpark snapshots ``SparkContext.environment`` when a Python function is created, so the
variable is set only around that creation, under a lock that every other creation in inorder
takes too (the data source's registration, the warm-up): nothing else is created with it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

#: The environment variable that names a worker's pool (its value is in no other use).
POOL_ENV = "INORDER_WORKER_POOL"
#: The engine's pool.
ENGINE_POOL = "engine"
#: The pool of the source's reads when they only ship marker rows (``inorder.rangesOnly``):
#: its daemon preloads only what that needs (:mod:`inorder.spark.daemon`).
SOURCE_POOL = "source"

_creating = threading.Lock()


def _environment(session: Any) -> dict[str, str] | None:
    try:
        environment: dict[str, str] = session.sparkContext.environment
    except Exception:  # Spark Connect: no SparkContext, Spark picks the pool itself
        return None
    return environment


@contextlib.contextmanager
def in_pool(session: Any, pool: str | None) -> Iterator[None]:
    """Python functions created inside this block run in ``pool`` (``None``: Spark's default).

    Only the creation (e.g. ``mapInArrow(...)``, ``dataSource.register``) needs the block;
    running the plan later keeps the pool.
    """
    environment = _environment(session)
    with _creating:
        if environment is None or pool is None:
            yield
            return
        before = environment.get(POOL_ENV)
        environment[POOL_ENV] = pool
        try:
            yield
        finally:
            if before is None:
                environment.pop(POOL_ENV, None)
            else:
                environment[POOL_ENV] = before


def engine_pool(session: Any) -> contextlib.AbstractContextManager[None]:
    """:func:`in_pool` for the engine's functions."""
    return in_pool(session, ENGINE_POOL)
