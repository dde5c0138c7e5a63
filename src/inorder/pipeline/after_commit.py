"""The outputs a pipeline derives from its committed change rows: the batch commit's step 5.

The session materializer and the session tables read the change log's committed rows and
commit outputs of their own; :class:`~inorder.engine.batch_commit.BatchCommit` runs them
after the sink's commit point, fenced by the same lease, in this order.
"""

from __future__ import annotations

from typing import Any

from inorder.engine.batch_commit import AfterCommit
from inorder.pipeline.spec import PipelineSpec

#: The phase both run under in the live progress and the batch's ``phase_seconds``.
PHASE = "tables"


def after_commit_hooks(pipeline: PipelineSpec[Any, Any, Any]) -> list[AfterCommit]:
    """The pipeline's after-commit outputs (none without ``materialized`` or ``tables``)."""
    from inorder.sessions.materializer import pipeline_materializer
    from inorder.sessions.tables_writer import pipeline_tables

    hooks = []
    materializer = pipeline_materializer(pipeline)
    if materializer is not None:
        hooks.append(AfterCommit(PHASE, materializer.after_commit))
    tables = pipeline_tables(pipeline)
    if tables is not None:
        hooks.append(AfterCommit(PHASE, tables.after_commit))
    return hooks
