"""A session table's rows compared with the change log one bucket of sessions at a time
(:func:`compare_bucket`), the findings kept as a whole-table comparison reports them
(:class:`RowFindings`).

A whole-table comparison reports, in this order: rows held twice (in table order); missing,
extra and different rows (each sorted by key); for a history table, versions held twice or
with a wrong ``is_current`` (table order); missing, extra and different versions (sorted);
overlapping versions (by the table order of their row's first version). A row's versions
are all in one bucket, so every finding is the same bucket by bucket; only which of them
are shown (the first :data:`~inorder.sessions.tables_check_log.SHOWN`) needs the order
across buckets, kept by each finding's sort key.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from inorder.sessions.tables_check_fast import matches
from inorder.sessions.tables_check_log import SHOWN, ChangeLogView, Key, TableCheck, short
from inorder.sessions.tables_check_spill import POSITION

#: One finding: its sort key within its phase, its kind, and its text (made when shown).
Finding = tuple[Any, str, Callable[[], str]]


@dataclass
class _Phase:
    """Findings of one step of the comparison: counts per kind, the smallest sort key of each
    kind (the order kinds first appear in), the first :data:`SHOWN` findings."""

    counts: dict[str, int] = field(default_factory=dict)
    first: dict[str, Any] = field(default_factory=dict)
    shown: list[tuple[Any, str]] = field(default_factory=list)

    def add(self, found: list[Finding]) -> None:
        for order, kind, _ in found:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if kind not in self.first or order < self.first[kind]:
                self.first[kind] = order
        kept = heapq.nsmallest(SHOWN, found, key=lambda f: f[0])
        merged = self.shown + [(order, text()) for order, _, text in kept]
        self.shown = heapq.nsmallest(SHOWN, merged, key=lambda s: s[0])


@dataclass
class RowFindings:
    """What comparing a table's rows found over all buckets so far."""

    rows: int = 0
    versions: int = 0
    phases: list[_Phase] = field(default_factory=lambda: [_Phase() for _ in range(9)])

    def report(self, check: TableCheck) -> None:
        """Count everything into ``check`` and show findings in the whole-table order."""
        check.rows, check.versions = self.rows, self.versions
        for phase in self.phases:
            for kind in sorted(phase.first, key=lambda k: phase.first[k]):
                check.tally(kind, phase.counts[kind])
            for _, text in phase.shown:
                check.show(text)


def compare_bucket(
    found: RowFindings, data: pa.Table, log: ChangeLogView, through: int, history: bool
) -> None:
    """The rows of ``data`` (a table's rows of some sessions, with :data:`POSITION`) against
    ``log`` (the change rows of the same sessions) as of batch ``through``.

    A bucket that matches is settled in Arrow (:func:`~inorder.sessions.tables_check_fast.
    matches`); any other is compared row by row in Python, which names what differs."""
    settled = matches(data, log, through, history)
    if settled is not None:
        found.rows += settled[0]
        found.versions += settled[1]
        return
    live = data.filter(pc.equal(data.column("is_current"), True)) if history else data
    _compare_live(found, live, log, through)
    if history:
        _check_versions(found, data, log, through)


def _compare_live(found: RowFindings, data: pa.Table, log: ChangeLogView, through: int) -> None:
    """The table's live rows against the sessions rebuilt from the change log."""
    want = log.live(through)
    found.rows += len(want)
    got: dict[Key, Any] = {}
    twice: list[Finding] = []
    names = ("topic", "session", "row_id", POSITION)
    columns = [data[c].to_pylist() for c in names]
    for *key, at, value in zip(*columns, log.values(data), strict=True):
        held = tuple(key)
        if held in got:
            twice.append(
                ((at,), "extra", _text(f"extra {held}: the table holds it more than once"))
            )
        got[held] = value
    found.phases[0].add(twice)
    _diff(found.phases[1:4], want, got, "", str)


def _check_versions(found: RowFindings, data: pa.Table, log: ChangeLogView, through: int) -> None:
    """Every history version against the change row that opened it, and their validity."""
    want = log.versions(through)
    found.versions += len(want)
    names = ("topic", "session", "row_id", "partition", "valid_from_offset", "valid_to_offset")
    columns = [data[c].to_pylist() for c in (*names, "is_current", POSITION)]
    got: dict[Key, Any] = {}
    spans: dict[Key, list[tuple[int, int | None]]] = {}
    first_at: dict[Key, int] = {}
    rows: list[Finding] = []
    for *key, start, end, is_current, at, value in zip(*columns, log.values(data), strict=True):
        if (*key, start) in got:
            text = f"version of {tuple(key)} from {start}: held twice"
            rows.append(((at, 0), "versions extra", _text(text)))
        got[(*key, start)] = value
        spans.setdefault(tuple(key), []).append((start, end))
        first_at.setdefault(tuple(key), at)
        if is_current != (end is None):
            text = (
                f"version of {tuple(key[:3])} from offset {start}: is_current {is_current} but "
                f"valid_to_offset {end}"
            )
            rows.append(((at, 1), "validity", _text(text)))
    found.phases[4].add(rows)
    _diff(found.phases[5:8], want, got, "versions ", _version_name)
    overlaps: list[Finding] = []
    for of, span in spans.items():
        span.sort(key=lambda s: s[0])
        for i, ((start, end), (following, _)) in enumerate(itertools.pairwise(span)):
            if end is None or end > following:
                text = (
                    f"versions of {of[:3]} overlap: the one from offset {start} ends at {end}, "
                    f"the next starts at {following}"
                )
                overlaps.append(((first_at[of], i), "overlapping versions", _text(text)))
    found.phases[8].add(overlaps)


def _version_name(key: Key) -> str:
    return f"version of {key[:3]} from offset {key[4]}"


def _diff(
    phases: list[_Phase],
    want: dict[Key, Any],
    got: dict[Key, Any],
    kind: str,
    name: Callable[[Key], str],
) -> None:
    """Keys only the change log has, only the table has, and with other data in each."""
    missing, extra, different = phases
    missing.add(
        [
            (k, f"{kind}missing", partial(_missing, name, k, want[k]))
            for k in want.keys() - got.keys()
        ]
    )
    extra.add(
        [(k, f"{kind}extra", partial(_extra, name, k, got[k])) for k in got.keys() - want.keys()]
    )
    different.add(
        [
            (k, f"{kind}different", partial(_different, name, k, got[k], want[k]))
            for k in want.keys() & got.keys()
            if want[k] != got[k]
        ]
    )


def _missing(name: Callable[[Key], str], key: Key, want: Any) -> str:
    return f"missing {name(key)}: the change log has {short(want)}"


def _extra(name: Callable[[Key], str], key: Key, got: Any) -> str:
    return f"extra {name(key)}: the table has {short(got)}, the change log none"


def _different(name: Callable[[Key], str], key: Key, got: Any, want: Any) -> str:
    return f"different {name(key)}: the table has {short(got)}, the change log {short(want)}"


def _text(text: str) -> Callable[[], str]:
    return lambda: text
