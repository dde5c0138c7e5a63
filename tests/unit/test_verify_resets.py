"""verify_tables' reset rules: first reset at the first fault, later ones only at faults."""

from __future__ import annotations

import pyarrow as pa

from inorder.dev.sim_model import FaultKind
from inorder.dev.simulator import FaultTruth, GroundTruth, SessionTruth
from inorder.dev.verify import verify_tables


def truth(*fault_offsets: int) -> GroundTruth:
    faults = tuple(FaultTruth(FaultKind.DROP, 1, "t", 0, o) for o in fault_offsets)
    session = SessionTruth(
        topic="t",
        session="s",
        partition=0,
        records=20,
        last_seq=19,
        snapshots=2,
        ended=False,
        faulty=bool(faults),
        faults=faults,
        table_exact=True,
        table={},
    )
    return GroundTruth({}, 20, 20, None, {}, {"t/s": session})


def resets(*offsets: int) -> pa.Table:
    n = len(offsets)
    return pa.table(
        {
            "topic": ["t"] * n,
            "session": ["s"] * n,
            "offset": list(offsets),
            "op": ["reset"] * n,
        }
    )


def test_resets_at_faults_pass() -> None:
    # The fault at 9 hit while the session waited for its next snapshot: no reset there.
    assert verify_tables({}, truth(4, 9, 15), resets(4, 15)).ok


def test_a_later_reset_where_no_fault_was_injected_is_reported() -> None:
    check = verify_tables({}, truth(4, 15), resets(4, 12))
    assert not check.ok
    assert check.reset_errors == ["t/s: reset at offset 12, where no fault was injected"]


def test_first_reset_must_be_at_the_first_fault() -> None:
    check = verify_tables({}, truth(4, 15), resets(15))
    assert check.reset_errors == ["t/s: first reset at offset 15, fault at 4"]


def test_a_session_without_faults_has_no_reset() -> None:
    check = verify_tables({}, truth(), resets(3))
    assert check.reset_errors == ["t/s: unexpected reset at 3"]
