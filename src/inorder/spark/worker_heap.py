"""Python worker hygiene shared by the code that runs inside Spark's Python workers.

PySpark's worker daemon runs a full ``gc.collect()`` after every task of a reused worker.
A worker holds a few hundred thousand long-lived objects (pyspark, pyarrow, pandas, the
processor's modules), and scanning them all took 0.1-0.3 s per task on two busy cores: with
one task per topic-partition and two Python workers per task (source read, engine), that was
the largest single cost of a micro-batch in the profile (see docs/benchmarks.md). Moving the
objects alive after a worker's first task into the permanent generation (``gc.freeze``) makes
those collections scan only what later tasks create.

Workers forked from inorder's daemon (:mod:`inorder.spark.daemon`) start with the preloaded modules
already frozen; this freezes what the first task added (the task's function, the processor's
modules, caches), which is still most of what a reused worker keeps.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_worker_heap() -> None:
    """Once per process: collect, then exclude every surviving object from later collections.

    Safe to call at the end of every task; only the first call does anything. Objects frozen
    are still freed by reference counting; only cyclic garbage created *before* the freeze
    would be kept, and the collection just before it removes that.
    """
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
