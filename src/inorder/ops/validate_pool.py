"""``inorder validate --jobs N``: partitions and the session-table check on N processes.

The work is a list of tasks in a fixed order: the session-table check (when it is to be
done), then each topic-partition. With one job they run here one after the other, the
partitions first, as :func:`~inorder.ops.validate.validate` and
:func:`~inorder.sessions.tables_check.check_pipeline_tables` always ran them. With ``N``
jobs, ``N - 1`` worker processes (started fresh, not forked: Kafka clients and Arrow's
threads do not survive a fork) take tasks from the front of the list, the table check
first (the longest), and this process takes the next one whenever it is free. Every worker
opens the pipeline itself but judges its partitions by this process's plan
(:class:`~inorder.ops.validate.ValidationPlan`: the same Kafka offsets for all), and the
results are put back in task order: the report is the one a single process makes.

Memory: each process holds one task at a time (a partition's chunk of records, or a bucket
of sessions), so the peak of the whole is about ``N`` times a single process's.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from inorder.errors import InorderError
from inorder.ops.target import OpsTarget
from inorder.ops.validate import (
    PartitionChecker,
    ValidationPlan,
    ValidationReport,
    finish_report,
    plan_progress,
    plan_validation,
)
from inorder.ops.validate_progress import ProgressLine
from inorder.ops.validate_report import PartitionDiff
from inorder.records import TopicPartition

#: A task: the session-table check (``None``) or a topic-partition.
Task = TopicPartition | None


@dataclass(frozen=True)
class Options:
    """What ``inorder validate`` asks: the pipeline (reference and ``--set`` overrides, and
    ``load``, a module-level function the workers open it with: the command line hands down
    the composition root's ``load_target``, which this room may not import), the range and
    chunking of the recomputation, and the tables' check (``tables``; ``owner``: the
    checkpoint id; ``bucket_rows``: ``None`` for the default)."""

    reference: str
    overrides: Mapping[str, Any]
    load: Callable[[str, Mapping[str, Any]], OpsTarget]
    from_offset: int | None = None
    from_time_ms: int | None = None
    chunk_records: int = 50_000
    tables: bool = False
    owner: str | None = None
    bucket_rows: int | None = None


class _Worker:
    """What a process needs to run tasks: the opened pipeline and the plan."""

    def __init__(self, target: OpsTarget, plan: ValidationPlan, options: Options) -> None:
        self.target, self.options = target, options
        self.partitions = PartitionChecker(target, plan)

    def run(self, task: Task, progress: ProgressLine | None = None) -> Any:
        if task is None:
            from inorder.sessions.tables_check import check_pipeline_tables

            opts = self.options
            return check_pipeline_tables(self.target.pipeline, opts.owner, opts.bucket_rows)
        return self.partitions.check(task, progress)


_WORKER: _Worker | None = None


def _start_worker(plan: ValidationPlan, options: Options) -> None:
    """A worker process's initialiser: open the pipeline once."""
    global _WORKER
    _WORKER = _Worker(options.load(options.reference, options.overrides), plan, options)


def _run_in_worker(task: Task) -> Any:
    assert _WORKER is not None
    return _WORKER.run(task)


def validate_all(
    target: OpsTarget,
    options: Options,
    jobs: int = 1,
    only: Callable[[TopicPartition], bool] | None = None,
    progress: ProgressLine | None = None,
) -> tuple[ValidationReport, Any]:
    """The partitions' report and the session tables' check (``None`` when not asked, or
    when the pipeline has no tables), on ``jobs`` processes (module docstring)."""
    report, plan, tps = plan_validation(
        target, options.from_offset, options.from_time_ms, options.chunk_records, only
    )
    if progress is not None:
        plan_progress(target, plan, progress)
    tasks: list[Task] = [*tps, None] if options.tables else list(tps)
    local = _Worker(target, plan, options)
    if jobs <= 1 or len(tasks) <= 1:
        results: list[Any] = []
        for task in tasks:
            if task is None and progress is not None:
                progress.show("validate: checking the session tables against the change log")
            results.append(local.run(task, progress))
    else:
        order: list[Task] = [None, *tps] if options.tables else list(tps)
        done = _in_pool(local, plan, options, order, jobs, progress)
        results = [done[task] for task in tasks]
    checked = [r for task, r in zip(tasks, results, strict=True) if task is not None]
    finish_report(report, checked)
    return report, results[-1] if options.tables else None


def _in_pool(
    local: _Worker,
    plan: ValidationPlan,
    options: Options,
    order: list[Task],
    jobs: int,
    progress: ProgressLine | None,
) -> dict[Task, Any]:
    """Each task's result, the tasks shared by ``jobs - 1`` workers and this process (the
    workers take from the front of ``order`` first). After an error no new task starts; once
    the tasks under way are done, the first partition's error is raised, else the tables'."""
    pending = deque(order)
    results: dict[Task, Any] = {}
    errors: dict[Task, BaseException] = {}
    running: dict[Future[Any], Task] = {}
    context = multiprocessing.get_context("spawn")
    workers = jobs - 1
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(plan, options)
    ) as pool:

        def collect(finished: set[Future[Any]]) -> None:
            for future in finished:
                task = running.pop(future)
                error = future.exception()
                if isinstance(error, BrokenProcessPool):
                    errors[task] = _worker_died(task, jobs)
                    continue
                if error is not None:
                    errors[task] = error
                    continue
                results[task] = future.result()
                if progress is not None and isinstance(results[task], tuple):
                    diff: PartitionDiff = results[task][0]
                    progress.advance(diff.records, str(task))

        while pending or running:
            collect({f for f in running if f.done()})
            while pending and not errors and len(running) < workers:
                task = pending.popleft()
                running[pool.submit(_run_in_worker, task)] = task
            if pending and not errors:
                task = pending.popleft()
                try:
                    results[task] = local.run(task, progress)
                except Exception as exc:
                    errors[task] = exc
            elif running:
                collect(wait(running, return_when=FIRST_COMPLETED).done)
            else:
                break
    for task in sorted(errors, key=lambda t: (t is None, t)):
        raise errors[task]  # a partition's before the tables', as one process meets them
    return results


def _worker_died(task: Task, jobs: int) -> InorderError:
    """A worker process ended without an answer: killed, or out of memory (the usual cause:
    every process holds a partition's records, so the peak is about ``jobs`` times one's)."""
    what = (
        "the session tables" if task is None else f"topic {task.topic!r} partition {task.partition}"
    )
    return InorderError(
        f"validate --jobs {jobs}: the worker process checking {what} ended abruptly (killed, "
        "or out of memory: each process holds one partition's records at a time); nothing "
        "was judged; run again with fewer --jobs (--jobs 1 runs in this process alone)"
    )
