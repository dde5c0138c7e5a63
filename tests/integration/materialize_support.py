"""Checks shared by the materialization tests: materializations vs the rebuilt change log."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from inorder.sessions import rebuild_tables
from inorder.sessions.materializer import read_materialized
from inorder.sessions.rebuild import ordered_changes
from inorder.sessions.table_book import due


def live_keys(changes: pa.Table) -> set[tuple[str, str]]:
    """Sessions whose last change is neither ``end`` nor ``reset``."""
    last: dict[tuple[str, str], str] = {}
    ordered = ordered_changes(changes)
    for topic, session, op in zip(
        ordered.column("topic").to_pylist(),
        ordered.column("session").to_pylist(),
        ordered.column("op").to_pylist(),
        strict=True,
    ):
        last[(topic, session)] = op
    return {k for k, op in last.items() if op not in ("end", "reset")}


def check_materializations(
    changes: pa.Table, output: pa.Table, batches: int, every: int
) -> dict[str, int]:
    """Every materialization equals the change log rebuilt up to its batch; none missing."""
    counts = {"periodic": 0, "end": 0, "reset": 0}
    keys = list(
        zip(
            output.column("batch_id").to_pylist(),
            output.column("topic").to_pylist(),
            output.column("session").to_pylist(),
            output.column("offset").to_pylist(),
            output.column("row_id").to_pylist(),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys)), "duplicate materialization rows"
    for b in range(batches):
        upto = changes.filter(pc.less_equal(changes.column("batch_id"), b))
        truth = rebuild_tables(upto) if upto.num_rows else {}
        rows_b = output.filter(pc.equal(output.column("batch_id"), b))
        written = read_materialized(rows_b)
        this = changes.filter(pc.equal(changes.column("batch_id"), b))
        dropped = this.filter(pc.is_in(this.column("op"), pa.array(["end", "reset"])))
        expected_drops = set(
            zip(
                dropped.column("topic").to_pylist(),
                dropped.column("session").to_pylist(),
                strict=True,
            )
        )
        reasons = {k: m.reason for k, m in written.items()}
        periodic = {k for k, r in reasons.items() if r == "periodic"}
        if due(b, every):
            assert periodic | expected_drops >= live_keys(upto)
            assert periodic <= live_keys(upto) | expected_drops
        else:
            assert not periodic, f"batch {b}: periodic materialization off schedule"
        for key in expected_drops:
            # The session's last drop in this batch is what a reader sees (no restart after
            # it in these logs unless the session is live again, then periodic wins).
            assert key in written, f"batch {b}: no end/reset materialization of {key}"
        for key, m in written.items():
            counts[m.reason] += 1
            if m.reason == "periodic":
                expected = truth.get(key, {})
            else:  # as of the end/reset itself (the session may restart later in the batch)
                expected = rebuild_tables(upto_offset(upto, key, m.partition, m.offset))[key]
            assert m.rows == expected, f"batch {b} {m.reason} {key}"
    return counts


def upto_offset(changes: pa.Table, key: tuple[str, str], partition: int, offset: int) -> pa.Table:
    """The change rows of one session up to (and including) an offset."""
    c = changes
    mask = pc.and_(
        pc.and_(pc.equal(c.column("topic"), key[0]), pc.equal(c.column("session"), key[1])),
        pc.and_(
            pc.equal(c.column("partition"), partition), pc.less_equal(c.column("offset"), offset)
        ),
    )
    return c.filter(mask)
