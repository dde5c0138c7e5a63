"""``Pipeline``: one object wiring source, codec, processor, integrity, sink and checkpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inorder.kafka.api import KafkaSource
from inorder.pipeline.spec import (
    BACKENDS,
    DEAD_LETTER_PARTITION_BY,
    DEAD_LETTER_SUFFIX,
    Backend,
    PipelineSpec,
)
from inorder.processor import Msg, Out, State

if TYPE_CHECKING:
    from inorder.pipeline.progress import RunSummary

__all__ = [
    "BACKENDS",
    "DEAD_LETTER_PARTITION_BY",
    "DEAD_LETTER_SUFFIX",
    "Backend",
    "Pipeline",
    "PipelineSpec",
]


class Pipeline(PipelineSpec[Msg, State, Out]):
    """A stateful, ordered streaming job from Kafka to a sink; ``run()`` runs it.

    ``trigger`` is an interval ("15 minutes"), ``"available-now"`` (process what is in Kafka
    now, in bounded batches, then return) or ``"once"``. Codec and integrity default to the
    processor's own (``default_codec()`` / ``default_integrity()``) or JSON into the
    processor's message type and ``Integrity.strict()``.

    Under the ``dead_letter`` policy, records that break a rule go to ``dead_letter``; by
    default a dataset of the output's kind at ``<output path>_dead_letter``.

    ``job_version`` adds a ``job_version`` column to every output row; ``initial_state``
    seeds a new checkpoint's state from a dataset and starts the source at the offsets that
    state corresponds to (see docs/versioned-jobs.md).

    ``materialized`` (a Parquet or Delta sink) with ``materialize_every=N`` writes every
    session's full table there every N micro-batches and each session's final table when it
    ends; session-table pipelines only (see docs/sessions.md).

    ``tables`` (:class:`~inorder.sessions.tables_writer.TableOutputs`) keeps a current
    (SCD1) and/or a history (SCD2) Delta or Iceberg table of the session tables, merged once
    per micro-batch after the change log's commit; session-table pipelines only
    (docs/tables.md).

    A ``KafkaSource`` naming an ``archive`` becomes a
    :class:`~inorder.archive.tiered_source.TieredSource` here, when the pipeline is built:
    the reading through the archive is the archive room's, and ``kafka/`` never imports it.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        # Anything else passed as the source (tests' stand-ins) is left as given.
        if isinstance(self.source, KafkaSource) and self.source.reads_archive:
            # The one place a pipeline's source meets the archive room: this class is the
            # public face, imported only by the composition root and the package's names, so
            # nothing below it (the runner works from PipelineSpec) depends on archive/.
            from inorder.archive.tiered_source import TieredSource

            self.source = TieredSource.of(self.source)

    def run(self, **runner_options: Any) -> RunSummary:
        """Run until the trigger says stop (available-now/once) or a signal; return a summary."""
        # Imported here: describing a pipeline (as executors unpickling one do) needs none of
        # the runner's imports.
        from inorder.pipeline.runner import PipelineRunner

        return PipelineRunner(self, **runner_options).run()
