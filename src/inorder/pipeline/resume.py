"""The pipeline as a run runs it: job version, initial state, and what a checkpoint asks.

:func:`prepare_run` is the one step the runner takes before it starts: a job version wraps the
sink (:class:`~inorder.sinks.versioned.VersionedSink`), an initial state starts a new
checkpoint's source at its offsets, and a repaired checkpoint's info file is applied
(:func:`resume_overrides`). ``inorder repair`` writes a fresh checkpoint whose info file says
how its batch ids continue the output's (``batch_offset``) and where the source starts
(``startingOffsets``); the runner applies both before it starts, and refuses a checkpoint
whose repair did not finish.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, TypeVar

from inorder.archive.initial_state import is_new_checkpoint, with_starting_offsets
from inorder.checkpoint.layout import CheckpointLayout
from inorder.errors import InorderError

if TYPE_CHECKING:
    from inorder.pipeline.spec import PipelineSpec

#: A pipeline's settings (:class:`~inorder.pipeline.spec.PipelineSpec` or the class that runs
#: them): each step returns the kind it was given.
SpecT = TypeVar("SpecT", bound="PipelineSpec[Any, Any, Any]")


def prepare_run(pipeline: SpecT, layout: CheckpointLayout) -> tuple[SpecT, bool]:
    """The pipeline as run on ``layout``, and whether its initial state must be seeded."""
    changes: dict[str, Any] = {}
    if pipeline.job_version:
        from inorder.sinks.versioned import VersionedSink

        if not isinstance(pipeline.sink, VersionedSink):
            changes["sink"] = VersionedSink(pipeline.sink, str(pipeline.job_version))
    initial = pipeline.initial_state
    seeding = initial is not None and is_new_checkpoint(layout)
    if initial is not None and seeding:
        changes["source"] = with_starting_offsets(pipeline.source, initial)
    if changes:
        pipeline = dataclasses.replace(pipeline, **changes)
    return resume_overrides(pipeline, layout), seeding


def resume_overrides(pipeline: SpecT, layout: CheckpointLayout) -> SpecT:
    """The pipeline as a repaired checkpoint runs it (the runner calls this before starting).

    ``batch_offset`` wraps the sinks in :class:`~inorder.sinks.offset_ids.BatchIdOffset`;
    ``startingOffsets`` starts the source there (Spark applies starting offsets only while
    its own checkpoint is new). A checkpoint whose repair did not finish is refused.
    """

    from inorder.sinks.offset_ids import BatchIdOffset

    info = layout.info()
    if info is None:
        return pipeline
    if info.repair_pending is not None:
        raise InorderError(
            f"checkpoint {layout.root}: a repair was started and did not finish; run "
            "`inorder repair PIPELINE --apply` again before running the pipeline"
        )
    changes: dict[str, Any] = {}
    offset = info.offset
    if offset > 0 and not isinstance(pipeline.sink, BatchIdOffset):
        changes["sink"] = BatchIdOffset(pipeline.sink, offset)
        if pipeline.dead_letter is not None:
            changes["dead_letter"] = BatchIdOffset(pipeline.dead_letter, offset)
    starting = info.starting_offsets
    if starting:
        text = json.dumps(starting, sort_keys=True)
        changes["source"] = dataclasses.replace(pipeline.source, starting_offsets=text)
    return dataclasses.replace(pipeline, **changes) if changes else pipeline
