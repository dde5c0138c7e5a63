"""Stop a batch that rejects most of its records: a setting is wrong, not the data.

A wrong ``row_key``, codec or envelope does not make a run fail under ``dead_letter`` or
``restart_session``: every record breaks a rule, each is set aside by the policy, and the
checkpoint moves past them. Real data is not that broken, so a batch in which more than
:attr:`~inorder.integrity.Integrity.reject_limit` of the records were rejected (and at least
:data:`~inorder.integrity.MIN_REJECTED`) stops before it commits, naming the rule and the
settings that usually cause it. Nothing of the batch is committed: fixing the setting and
running again reads the same records.
"""

from __future__ import annotations

from collections.abc import Sequence

from inorder.engine.results import TaskResult
from inorder.errors import ConfigError
from inorder.integrity import MIN_REJECTED, Integrity

#: Per rule, the settings to look at when most records break it.
SETTING_HINTS = {
    "undecodable": "the codec ([codec]), processor.options.envelope or processor.options.row_key",
    "row_schema": "processor.options.row_type or processor.options.row_key",
    "insert_existing_row": "processor.options.row_key (is it unique per row?)",
    "update_missing_row": "processor.options.row_key (is it unique per row?)",
    "delete_missing_row": "processor.options.row_key (is it unique per row?)",
    "before_snapshot": "processor.options.envelope (require_snapshot)",
    "seq_gap": "processor.options.envelope (seq_field)",
    "seq_repeat": "processor.options.envelope (seq_field)",
    "sequence_gap": "integrity.sequence_field",
    "sequence_repeat": "integrity.sequence_field",
    "sequence_missing": "integrity.sequence_field",
    "source_order": "the source (a connector pointed at another database?)",
}


def check_rejections(batch_id: int, results: Sequence[TaskResult], integrity: Integrity) -> None:
    """Raise :class:`~inorder.errors.ConfigError` when the batch rejected too much.

    Rejected records are those that broke a rule. The later records of keys reset under
    ``restart_session`` are not counted: after a state loss (``inorder repair``) or a real
    gap, many of them are ignored by design. ``fail`` stops at the first violation anyway.
    """
    if integrity.on_violation == "fail" or integrity.reject_limit >= 1.0:
        return
    records = sum(r.records for r in results)
    by_rule: dict[str, int] = {}
    for r in results:
        for rule, count in r.violation_counts.items():
            by_rule[rule] = by_rule.get(rule, 0) + count
    rejected = sum(by_rule.values())
    if not by_rule or rejected < MIN_REJECTED or rejected <= integrity.reject_limit * records:
        return
    rule = max(by_rule, key=lambda name: by_rule[name])
    first = next((v for r in results for v in r.violations if v.rule == rule), None)
    example = f" (the first: {first.message()})" if first is not None else ""
    hint = SETTING_HINTS.get(rule, "the processor's options and the codec")
    raise ConfigError(
        f"batch {batch_id}: {rejected:,} of {records:,} records were rejected, most "
        f"for rule {rule!r} ({by_rule[rule]:,}){example}; data is rarely that broken, a "
        f"setting is: check {hint}. Nothing of this batch was committed: fix the setting "
        "and run again (the same records are read), or raise integrity.reject_limit "
        f"(now {integrity.reject_limit:g}; 1 turns this check off)"
    )


__all__ = ["SETTING_HINTS", "check_rejections"]
