"""What a checkpoint asks of the pipeline that resumes it (after ``inorder repair``).

``inorder repair`` writes a fresh checkpoint whose info file says how its batch ids continue
the output's (``batch_offset``) and where the source starts (``startingOffsets``); the runner
applies both before it starts, and refuses a checkpoint whose repair did not finish.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from inorder.checkpoint.layout import CheckpointLayout
from inorder.errors import InorderError


def resume_overrides(pipeline: Any, layout: CheckpointLayout) -> Any:
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
    if starting and hasattr(pipeline.source, "starting_offsets"):
        text = json.dumps(starting, sort_keys=True)
        changes["source"] = dataclasses.replace(pipeline.source, starting_offsets=text)
    return dataclasses.replace(pipeline, **changes) if changes else pipeline
