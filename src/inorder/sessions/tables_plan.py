"""The net change one micro-batch makes to the query-ready session tables (pure, no I/O).

Two Delta tables can be kept beside a session change log (docs/tables.md):

* the **current** table (SCD type 1): one row per live ``(topic, session, row_id)``;
* the **history** table (SCD type 2): one row per version of each row, with the offsets and
  Kafka timestamps between which it was the row's value.

:func:`plan_batch` walks a batch's change rows in application order
(:func:`~inorder.sessions.rebuild.ordered_changes`) and returns what the batch changes, per
row key, with the rules of :func:`~inorder.sessions.rebuild_tables`:

* ``insert`` / ``update`` set a row (a new version; the open one is closed by ``update``),
* ``delete`` removes it (its open version is closed by ``delete``),
* ``clear`` (a snapshot starts) removes every row of the session: rows the snapshot lists
  again come back as its ``insert`` rows, so rows it no longer lists are deleted, and every
  open version is closed by ``snapshot`` (the snapshot's rows open new versions),
* ``reset`` removes every row (closed by ``reset``),
* ``end`` keeps the session's rows (``end="keep"``, like the change log: its final table) or
  removes them (``end="drop"``, closed by ``end``).

Changes are referred to by their position in the batch (``index``), so the caller builds the
tables' rows from the change log's Arrow columns with ``take`` instead of per-row Python
values. The planner only needs the row ids each session had before the batch
(:data:`LiveKeys`); it never mutates them and returns the sessions' row ids after the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

#: What ``end`` does to a session's rows in the tables.
EndMode = Literal["keep", "drop"]
END_MODES: tuple[str, ...] = ("keep", "drop")

#: A session: ``(topic, session)``.
SessionKey = tuple[str, str]
#: A row of a session: ``(topic, session, row_id)``.
RowKey = tuple[str, str, str]
#: The row ids of every live session.
LiveKeys = Mapping[SessionKey, frozenset[str] | set[str]]

#: ``closed_by`` of a history version: what ended it.
CLOSED_BY = ("update", "delete", "snapshot", "reset", "end")


@dataclass(frozen=True, slots=True)
class ChangeColumns:
    """The fields of a batch's change rows the planner reads, as parallel lists.

    Rows are in application order; position ``i`` of each list is change ``i``.
    """

    topics: Sequence[str]
    sessions: Sequence[str]
    ops: Sequence[str]
    row_ids: Sequence[str | None]

    def __len__(self) -> int:
        return len(self.ops)


@dataclass(frozen=True, slots=True)
class Close:
    """A version opened before the batch that the batch ends (change ``index`` ends it)."""

    key: RowKey
    index: int
    closed_by: str


@dataclass(frozen=True, slots=True)
class Version:
    """A version the batch opens at change ``index``; ``closed_at`` is set when the same
    batch ends it again (``closed_by`` says why)."""

    index: int
    closed_at: int | None = None
    closed_by: str | None = None


@dataclass(slots=True)
class SessionDelta:
    """How a session's row ids change: ``wiped`` (every earlier row gone), then ``removed``
    rows gone and ``added`` rows live."""

    wiped: bool = False
    removed: set[str] = field(default_factory=set)
    added: set[str] = field(default_factory=set)


@dataclass
class BatchPlan:
    """What a batch changes in the current and the history table.

    ``upserts``: the change that last set each row the current table must insert or replace;
    ``deletes``: rows the current table held before the batch that are gone after it;
    ``closes`` / ``versions``: the history table's closed and new versions; ``sessions``: how
    the row ids of every session the batch touched change (:func:`apply_live`).
    """

    upserts: list[int] = field(default_factory=list)
    deletes: list[RowKey] = field(default_factory=list)
    closes: list[Close] = field(default_factory=list)
    versions: list[Version] = field(default_factory=list)
    sessions: dict[SessionKey, SessionDelta] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Whether neither table changes."""
        return not (self.upserts or self.deletes or self.closes or self.versions)


class _Walk:
    """One session during the walk, in time proportional to its changes, not its rows.

    Rows live before the batch stay in ``before`` (never copied): one is still open unless
    the session was ``wiped`` or the row is in ``gone``. ``opened`` maps the rows opened in
    the batch to their version; ``last_set`` the rows set in the batch to their change.
    """

    __slots__ = ("before", "gone", "last_set", "opened", "wiped")

    def __init__(self, before: frozenset[str] | set[str]) -> None:
        self.before = before
        self.wiped = False
        self.gone: set[str] = set()
        self.opened: dict[str, int] = {}
        self.last_set: dict[str, int] = {}


def plan_batch(live: LiveKeys, changes: ChangeColumns, end: EndMode = "keep") -> BatchPlan:
    """The net change of ``changes`` (one or more batches, in application order) per row key.

    ``live`` holds the row ids of each session before the changes (sessions without rows may
    be absent). Raises ``ValueError`` for an ``op`` that is not a change-log op or a row change
    without a row id (not a change log written by :class:`~inorder.sessions.SessionTables`).
    """
    if end not in END_MODES:
        raise ValueError(f"end must be 'keep' or 'drop', not {end!r}")
    plan = BatchPlan()
    versions = plan.versions
    closes = plan.closes
    walks: dict[SessionKey, _Walk] = {}

    def close(walk: _Walk, key: SessionKey, rid: str, index: int, reason: str) -> None:
        opened = walk.opened.pop(rid, None)
        if opened is not None:
            versions[opened] = Version(versions[opened].index, index, reason)
        elif not walk.wiped and rid in walk.before and rid not in walk.gone:
            walk.gone.add(rid)
            closes.append(Close((key[0], key[1], rid), index, reason))

    def close_all(walk: _Walk, key: SessionKey, index: int, reason: str) -> None:
        for rid in walk.opened:
            opened = walk.opened[rid]
            versions[opened] = Version(versions[opened].index, index, reason)
        if not walk.wiped:
            topic, session = key
            gone = walk.gone
            closes.extend(
                Close((topic, session, rid), index, reason)
                for rid in walk.before
                if rid not in gone
            )
        walk.wiped = True
        walk.gone = set()
        walk.opened = {}
        walk.last_set = {}

    ops = changes.ops
    row_ids = changes.row_ids
    for i, (topic, session) in enumerate(zip(changes.topics, changes.sessions, strict=True)):
        key = (topic, session)
        walk = walks.get(key)
        if walk is None:
            walk = walks[key] = _Walk(live.get(key, frozenset()))
        op = ops[i]
        if op == "insert" or op == "update":
            rid = _row_id(row_ids[i], op, key)
            close(walk, key, rid, i, "update")
            walk.opened[rid] = len(versions)
            versions.append(Version(i))
            walk.last_set[rid] = i
        elif op == "delete":
            rid = _row_id(row_ids[i], op, key)
            close(walk, key, rid, i, "delete")
            walk.last_set.pop(rid, None)
        elif op == "clear" or op == "reset" or op == "end":
            if op == "end" and end == "keep":
                continue  # the session's final table stays
            close_all(walk, key, i, "snapshot" if op == "clear" else op)
        else:
            raise ValueError(f"change {i} of session {session!r}: unknown op {op!r}")
    for key, walk in walks.items():
        topic, session = key
        added = set(walk.opened)
        removed = set(walk.before) if walk.wiped else walk.gone
        plan.sessions[key] = SessionDelta(walk.wiped, removed, added)
        plan.deletes.extend((topic, session, rid) for rid in removed if rid not in added)
        # Rows open now were set in the batch (a row open since before is untouched).
        plan.upserts.extend(walk.last_set[rid] for rid in added)
    plan.upserts.sort()
    return plan


def _row_id(rid: str | None, op: str, key: SessionKey) -> str:
    if rid is None:
        raise ValueError(f"session {key[1]!r} of topic {key[0]!r}: {op} without a row_id")
    return rid


def apply_live(live: dict[SessionKey, set[str]], plan: BatchPlan) -> None:
    """Bring ``live`` to after the planned batch (sessions left without rows are removed)."""
    for key, delta in plan.sessions.items():
        rows = set() if delta.wiped else live.get(key, set())
        rows -= delta.removed
        rows |= delta.added
        if rows:
            live[key] = rows
        else:
            live.pop(key, None)
