"""A topic pattern that matches nothing, checked against a real broker before a query starts.

Reproduced before the change: under a trigger that ends (available-now, once) a mistyped
``topic_pattern`` "succeeded", reading zero records, with a warning that named no topic; the
pattern was then recorded in the checkpoint as the pipeline's subscription, so correcting the
typo needed ``--accept-changes``. Now such a start is refused in one line that names the
pattern and the closest topic names (the broker's internal ``_`` topics left out); a
long-running query may still wait for its topics, with the same names in its warning.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from inorder.checkpoint.layout import CheckpointLayout
from inorder.errors import ConfigError
from inorder.kafka import KafkaSource
from inorder.pipeline.archiver import Archive


@pytest.fixture
def orders(kafka: Any) -> str:
    """A fresh topic ``<prefix>-orders``, and an internal-looking ``_<prefix>-orders`` beside it."""
    prefix = f"pat{random.randrange(10**9)}"
    kafka.new_topic(f"_{prefix}-orders")
    return str(kafka.new_topic(f"{prefix}-orders"))


def test_a_pattern_matching_nothing_is_refused_when_the_query_would_end(
    kafka: Any, orders: str, tmp_path: Path
) -> None:
    typo = orders.replace("-orders", "-ordres") + ".*"
    source = KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topic_pattern=typo)
    with pytest.raises(ConfigError) as refused:
        source.check(bounded=True)
    assert str(refused.value) == (
        f"topic_pattern {typo!r} matches no topic on {kafka.bootstrap_servers} (closest "
        f"topics: {orders}): under trigger available-now or once the run would read nothing; "
        "correct the pattern, or create a matching topic first"
    )

    # A query that keeps running may wait for its topics: a warning naming the same topic.
    (note,) = source.check()
    assert note.startswith(
        f"warning: topic_pattern {typo!r} matches no topic on {kafka.bootstrap_servers} "
        f"(closest topics: {orders}): nothing is read until a matching topic appears"
    ), note

    # The corrected pattern is fine either way.
    fixed = KafkaSource(bootstrap_servers=kafka.bootstrap_servers, topic_pattern=orders + ".*")
    assert fixed.check(bounded=True) == [f"subscribed to 1 topic matching '{orders}.*': {orders}"]

    # `inorder archive` under available-now refuses it too, before Spark starts.
    archive = Archive(
        source=source,
        path=str(tmp_path / "archive"),
        checkpoint=str(tmp_path / "ck"),
        trigger="available-now",
    )
    with pytest.raises(ConfigError, match=f"closest topics: {orders}"):
        archive.run()
    spark_dir = CheckpointLayout.of(str(tmp_path / "ck")).spark_dir
    assert not (tmp_path / "archive").exists() and not Path(spark_dir).exists()
