"""Start-time checks in pure logic: the topic-pattern note and integrity vs processor.

The end-to-end behaviour (CLI and ``Pipeline.run``) is in tests/e2e/test_start_checks.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any, TypedDict

import msgspec
import pytest

from inorder.errors import ConfigError
from inorder.integrity import Integrity
from inorder.integrity_fit import check_fits
from inorder.kafka.api import closest_topics, no_match_error, pattern_note
from inorder.processor import Context, Processor


def test_pattern_note_lists_topics_and_counts_the_rest() -> None:
    one = pattern_note("a-.*", ["a-1"], "h:9092", timedelta(seconds=30))
    assert one == "subscribed to 1 topic matching 'a-.*': a-1"
    many = [f"site-{i:02}" for i in range(25)]
    note = pattern_note("site-.*", many, "h:9092", timedelta(seconds=30))
    assert note.startswith("subscribed to 25 topics matching 'site-.*': site-00, site-01, ")
    assert note.endswith("site-09, ... (15 more)")


def test_pattern_note_warns_when_nothing_matches() -> None:
    note = pattern_note("sites-.*", [], "h:9092", timedelta(minutes=2))
    assert note.startswith("warning: topic_pattern 'sites-.*' matches no topic on h:9092")
    assert "every 120 s, topic_discovery_interval" in note


TOPICS = ["site-a", "site-b", "site-c", "orders", "__consumer_offsets", "_schemas", "sites_x"]


def test_the_closest_topic_names_are_suggested_and_internal_ones_never() -> None:
    assert closest_topics("sites-.*", TOPICS) == ["site-a", "site-b", "site-c"]
    assert closest_topics("site_.*", TOPICS) == ["sites_x", "site-a", "site-b"]
    assert closest_topics("ordres", TOPICS) == ["orders"]
    assert closest_topics(r"site\-[0-9]+", TOPICS) == ["site-a", "site-b", "site-c"]
    assert closest_topics("_schema.*", TOPICS) == []  # topics starting with _ are not offered
    assert closest_topics("invoices", TOPICS) == []
    assert closest_topics(".*", TOPICS) == []


def test_a_pattern_matching_nothing_names_the_closest_topics() -> None:
    note = pattern_note("sites-.*", [], "h:9092", timedelta(seconds=30), existing=TOPICS)
    assert note == (
        "warning: topic_pattern 'sites-.*' matches no topic on h:9092 (closest topics: site-a, "
        "site-b, site-c): nothing is read until a matching topic appears (looked for every "
        "30 s, topic_discovery_interval)"
    )
    assert no_match_error("invoices-.*", TOPICS, "h:9092") == (
        "topic_pattern 'invoices-.*' matches no topic on h:9092 (no topic name is close to it): "
        "under trigger available-now or once the run would read nothing; correct the pattern, "
        "or create a matching topic first"
    )


class Tick(msgspec.Struct, rename="camel"):
    site_id: str
    seq_no: int


class TickDict(TypedDict):
    site: str
    seq: int


class Counter:
    """Counts nothing: the checks only read the processor's types and methods."""

    def key(self, msg: Any) -> str:
        return "k"

    def initial_state(self, key: str) -> dict[str, int]:
        return {}

    def process(self, state: dict[str, int], msg: Any, ctx: Context) -> Iterable[Row]:
        return ()


class Row(msgspec.Struct):
    n: int


class TickCounter(Counter, Processor[Tick, dict[str, int], Row]):
    pass


class TickDictCounter(Counter, Processor[TickDict, dict[str, int], Row]):
    pass


class AnyCounter(Counter, Processor[dict[str, Any], dict[str, int], Row]):
    pass


class RestartingTickCounter(TickCounter):
    def starts_session(self, msg: Tick) -> bool:
        return msg.seq_no == 0


def test_sequence_field_is_a_python_field_name_of_the_message_type() -> None:
    # msgspec reads the attribute: the Python name counts, not the renamed key.
    check_fits(Integrity.strict(sequence_field="seq_no"), TickCounter())
    with pytest.raises(ConfigError) as refused:
        check_fits(Integrity.strict(sequence_field="seqNo"), TickCounter())
    assert str(refused.value) == (
        "integrity.sequence_field = 'seqNo' is not a field of the message type Tick "
        "(its fields: site_id, seq_no); did you mean 'seq_no'?"
    )
    check_fits(Integrity.strict(sequence_field="seq"), TickDictCounter())
    with pytest.raises(ConfigError, match=r"TickDict \(its fields: site, seq\)"):
        check_fits(Integrity.strict(sequence_field="sequence"), TickDictCounter())
    # A plain dict has no fixed fields: nothing to tell before records arrive.
    check_fits(Integrity.strict(sequence_field="anything"), AnyCounter())


def test_restart_session_needs_starts_session() -> None:
    with pytest.raises(ConfigError, match=r"TickCounter has no starts_session"):
        check_fits(Integrity.strict(on_violation="restart_session"), TickCounter())
    with pytest.raises(ConfigError, match=r"integrity.on_violation"):
        check_fits(
            Integrity.fuzzy(timedelta(seconds=1), on_violation="restart_session"), TickCounter()
        )
    check_fits(Integrity.strict(on_violation="restart_session"), RestartingTickCounter())
    check_fits(Integrity.strict(on_violation="fail"), TickCounter())
    check_fits(Integrity.strict(on_violation="dead_letter"), TickCounter())
