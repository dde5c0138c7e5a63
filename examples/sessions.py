"""The session-table pipeline from Python (the same job as ``examples/sessions.toml``).

    inorder run examples.sessions:pipeline
    python examples/sessions.py

``INORDER_EXAMPLE_TOPICS``, ``INORDER_EXAMPLE_OUTPUT`` and ``INORDER_EXAMPLE_CHECKPOINT``
override the topic pattern, output and checkpoint locations.
"""

from __future__ import annotations

import os
from typing import Any

from inorder import Integrity, KafkaSource, ParquetSink, Pipeline, SessionTables
from inorder.endpoints import kafka_bootstrap_servers


def pipeline() -> Pipeline[Any, Any, Any]:
    """Rebuild every session's table from its snapshot and updates; land the change log."""
    return Pipeline(
        source=KafkaSource(
            bootstrap_servers=kafka_bootstrap_servers(),
            topic_pattern=os.environ.get("INORDER_EXAMPLE_TOPICS", "site-.*"),
            max_offsets_per_trigger=200_000,
        ),
        processor=SessionTables(row_key="id"),
        integrity=Integrity.strict(on_violation="restart_session"),
        sink=ParquetSink(
            os.environ.get("INORDER_EXAMPLE_OUTPUT", ".inorder/demo/output-py"),
            partition_by=["topic"],
            compression="zstd",
        ),
        checkpoint=os.environ.get("INORDER_EXAMPLE_CHECKPOINT", ".inorder/demo/checkpoint-py"),
        trigger="available-now",
        spark_master="local[2]",
    )


if __name__ == "__main__":
    print(pipeline().run())
