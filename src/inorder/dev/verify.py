"""Checking session tables rebuilt from a pipeline's output against the simulator's truth."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.dev.ground_truth import GroundTruth

Tables = Mapping[tuple[str, str], Mapping[str, Any]]


@dataclass
class Verification:
    """How the rebuilt tables compare with the ground truth."""

    sessions: int = 0
    exact: int = 0
    unknown: int = 0
    mismatched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    resets_expected: int = 0
    resets_found: int = 0
    reset_errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every checkable session exact and every reset where the truth says."""
        return not (self.mismatched or self.missing or self.reset_errors)

    def lines(self) -> list[str]:
        """A human summary."""
        out = [
            f"sessions checked: {self.sessions} ({self.exact} exact, "
            f"{self.unknown} not checkable: a fault after their last snapshot)",
            f"resets: {self.resets_found} in {self.resets_expected} faulty sessions, each "
            "session's first reset at the offset of its first fault",
        ]
        for label, items in (
            ("mismatched", self.mismatched),
            ("missing", self.missing),
            ("reset problems", self.reset_errors),
        ):
            if items:
                out.append(f"{label}: {len(items)} e.g. {', '.join(items[:3])}")
        return out


def verify_tables(
    tables: Tables, truth: GroundTruth, changes: pa.Table | None = None
) -> Verification:
    """Compare rebuilt tables (and, given the change rows, the resets) with the truth.

    A faulty session must have its first ``reset`` at the offset of its first violating record
    and any later one at the offset of another injected fault (faults that hit while the
    session waits for its next snapshot raise none); sessions without faults must have none.
    """
    result = Verification()
    for session in truth.sessions.values():
        result.sessions += 1
        key = (session.topic, session.session)
        if not session.table_exact or session.table is None:
            result.unknown += 1
        elif key not in tables:
            if session.table:
                result.missing.append(session.key)
            else:
                result.exact += 1
        elif dict(tables[key]) == session.table:
            result.exact += 1
        else:
            result.mismatched.append(session.key)
    if changes is not None:
        _verify_resets(changes, truth, result)
    return result


def _verify_resets(changes: pa.Table, truth: GroundTruth, result: Verification) -> None:
    resets = changes.filter(pc.equal(changes.column("op"), "reset"))
    found: dict[tuple[str, str], list[int]] = {}
    for topic, session, offset in zip(
        resets.column("topic").to_pylist(),
        resets.column("session").to_pylist(),
        resets.column("offset").to_pylist(),
        strict=True,
    ):
        found.setdefault((topic, session), []).append(offset)
    result.resets_found = sum(len(v) for v in found.values())
    for session in truth.sessions.values():
        key = (session.topic, session.session)
        offsets = sorted(found.pop(key, []))
        if not session.faults:
            if offsets:
                result.reset_errors.append(f"{session.key}: unexpected reset at {offsets[0]}")
            continue
        result.resets_expected += 1
        faults = {f.offset for f in session.faults}
        first = min(faults)
        if not offsets:
            result.reset_errors.append(f"{session.key}: no reset (fault at offset {first})")
        elif offsets[0] != first:
            result.reset_errors.append(
                f"{session.key}: first reset at offset {offsets[0]}, fault at {first}"
            )
        # Later resets (after the session's next snapshot) must each be at an injected fault.
        for offset in offsets[1:]:
            if offset not in faults:
                result.reset_errors.append(
                    f"{session.key}: reset at offset {offset}, where no fault was injected"
                )
    for topic, session_id in found:
        result.reset_errors.append(f"{topic}/{session_id}: reset of an unknown session")
