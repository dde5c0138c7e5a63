"""Pure, seeded model of collection sites publishing snapshot/update sessions.

Nothing here touches a broker or a clock: :class:`SiteModel` turns a :class:`SimulationConfig`
into the exact sequence of Kafka records to produce (topic, key, value), and keeps the
bookkeeping needed for the ground truth (each session's intended table, the faults injected
and which record a consumer sees as violating). The same seed gives the same records in the
same order, byte for byte. The settings classes live in :mod:`inorder.dev.sim_config` and are
importable from here too.

Messages follow the session contract (design §3)::

    {"type":"snapshot","session":S,"seq":0,"ts":...,"rows":[{"id":"r1",...},...]}
    {"type":"insert"|"update","session":S,"seq":N,"ts":...,"row":{"id":...,...}}
    {"type":"delete","session":S,"seq":N,"ts":...,"id":"r9"}
    {"type":"end","session":S,"seq":N,"ts":...}

Faults hit insert/update/delete messages of *faulty* sessions only, and the message of a
session that follows a fault is always clean, so every fault shows to a consumer as exactly one
recognisable pattern (see :class:`FaultKind`). A fault that would not be visible to a consumer
(a drop or swap whose partner message is a snapshot or ``end``, or that is still pending when
the run stops) is cancelled: the held message is sent unchanged and nothing is recorded.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from inorder.dev.sim_config import FaultKind, FaultRates, OpMix, SimulationConfig

__all__ = [
    "DATA_TYPES",
    "FaultKind",
    "FaultRates",
    "InjectedFault",
    "OpMix",
    "Row",
    "SessionModel",
    "SimRecord",
    "SimulationConfig",
    "SiteModel",
]

Row = dict[str, Any]

#: Message types that carry a row change; only these are ever hit by a fault.
DATA_TYPES = frozenset({"insert", "update", "delete"})

_NAMES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
_encode = msgspec.json.Encoder().encode


@dataclass(slots=True, eq=False)
class SimRecord:
    """One Kafka record to produce, numbered in production order (``index`` from 0).

    ``track`` is set on the records whose (partition, offset) the ground truth needs: the
    first record of each session and every record a consumer sees as violating.
    """

    index: int
    topic: str
    key: bytes
    value: bytes
    session: str = field(repr=False)
    seq: int = field(repr=False)
    track: bool = field(repr=False)


@dataclass
class InjectedFault:
    """A fault as injected; ``record`` is the index of the first violating record."""

    kind: FaultKind
    seq: int
    record: int


@dataclass
class SessionModel:
    """One session's producer-side truth: its current table and what happened to it."""

    topic: str
    session: str
    faulty: bool
    table: dict[str, Row] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)
    seq: int = -1
    since_snapshot: int = 0
    next_row: int = 1
    snapshots: int = 0
    ended: bool = False
    records: int = 0
    messages: int = 0
    first_record: int | None = None
    last_snapshot_record: int | None = None
    faults: list[InjectedFault] = field(default_factory=list)
    # A message held back for a drop or swap, resolved by the session's next message.
    held: tuple[FaultKind, int, bytes] | None = None
    clean_next: bool = False

    @property
    def key(self) -> str:
        """``<topic>/<session>``: the ground-truth key of the session."""
        return f"{self.topic}/{self.session}"

    @property
    def table_exact(self) -> bool:
        """A consumer rebuilds ``table`` exactly: no fault, or a snapshot after the last one."""
        if not self.faults:
            return True
        return self.last_snapshot_record is not None and (
            self.last_snapshot_record > self.faults[-1].record
        )


class SiteModel:
    """Generates the records of a simulation, deterministically from ``config.seed``.

    Iterate :meth:`records`; stop early (duration) by calling :meth:`drain` for the held-back
    messages. Sessions of a site interleave at random; late sites join after
    :meth:`activate_late_sites` (called automatically after ``late_after * messages``
    messages when ``messages`` is set).
    """

    def __init__(self, config: SimulationConfig) -> None:
        config.validate()
        self.config = config
        self._rng = random.Random(config.seed)
        # random() is a C call; randrange() costs several Python frames per message.
        self._rnd = self._rng.random
        self._next_index = 0
        self.messages = 0
        self.late_activated_at: int | None = None
        self.sessions: list[SessionModel] = []
        self._slots: list[list[SessionModel]] = []
        self._session_counter: list[int] = []
        self._active_sites = config.sites
        for site in range(config.sites + config.late_sites):
            self._session_counter.append(0)
            self._slots.append([self._new_session(site) for _ in range(config.sessions_per_site)])
        mix = config.mix
        total = mix.insert + mix.update + mix.delete
        self._p_insert = mix.insert / total
        self._p_update = (mix.insert + mix.update) / total
        rates = config.faults
        self._fault_cuts = (
            (rates.drop, FaultKind.DROP),
            (rates.drop + rates.duplicate, FaultKind.DUPLICATE),
            (rates.drop + rates.duplicate + rates.swap, FaultKind.SWAP),
            (rates.total(), FaultKind.MALFORMED),
        )
        self._any_faults = rates.total() > 0
        self._late_at: int | None = None
        if config.late_sites and config.messages is not None:
            self._late_at = int(config.late_after * config.messages)

    # -- public -------------------------------------------------------------------------------

    def records(self) -> Iterator[SimRecord]:
        """All records in production order (up to ``config.messages`` messages, then drained)."""
        limit = self.config.messages
        while limit is None or self.messages < limit:
            if self._late_at is not None and self.messages >= self._late_at:
                self.activate_late_sites()
            yield from self.step()
        yield from self.drain()

    def step(self) -> list[SimRecord]:
        """Generate one message of a random session of an active site; its records."""
        rnd = self._rnd
        sessions = self._slots[int(rnd() * self._active_sites)]
        slot = int(rnd() * len(sessions))
        sess = sessions[slot]
        self.messages += 1
        out: list[SimRecord] = []
        mtype, value = self._next_message(sess)
        seq = sess.seq
        held = sess.held
        if held is not None:
            sess.held = None
            sess.clean_next = True
            kind, held_seq, held_value = held
            partner_ok = mtype in DATA_TYPES or (kind is FaultKind.DROP and mtype == "end")
            if not partner_ok:  # Not observable: send both in order, record nothing.
                self._emit(out, sess, held_value, held_seq)
                self._emit(out, sess, value, seq, mtype=mtype)
            elif kind is FaultKind.DROP:
                rec = self._emit(out, sess, value, seq, mtype=mtype, track=True)
                sess.faults.append(InjectedFault(kind, held_seq, rec.index))
            else:  # SWAP: later message first; it is the first violating record.
                rec = self._emit(out, sess, value, seq, mtype=mtype, track=True)
                self._emit(out, sess, held_value, held_seq)
                sess.faults.append(InjectedFault(kind, held_seq, rec.index))
        elif mtype in DATA_TYPES and sess.faulty and self._any_faults and not sess.clean_next:
            self._maybe_fault(out, sess, value, seq, mtype)
        else:
            sess.clean_next = False
            self._emit(out, sess, value, seq, mtype=mtype)
        if mtype == "end":
            sess.ended = True
            sessions[slot] = self._new_session(self._site_of(sess))
        return out

    def drain(self) -> list[SimRecord]:
        """Records of messages still held back for a fault: sent unchanged (fault cancelled)."""
        out: list[SimRecord] = []
        for sess in self.sessions:
            if sess.held is not None:
                _, held_seq, held_value = sess.held
                sess.held = None
                self._emit(out, sess, held_value, held_seq)
        return out

    def activate_late_sites(self) -> None:
        """From now on, late sites are picked too (idempotent)."""
        if self.late_activated_at is None and self.config.late_sites:
            self.late_activated_at = self.messages
            self._active_sites = self.config.sites + self.config.late_sites

    @property
    def records_emitted(self) -> int:
        """Number of records generated so far."""
        return self._next_index

    # -- generation ---------------------------------------------------------------------------

    def _new_session(self, site: int) -> SessionModel:
        topic = self.config.topic(site)
        number = self._session_counter[site]
        self._session_counter[site] = number + 1
        # Every 1/f-th session is faulty: the fraction is exact even for a handful of sessions.
        n = len(self.sessions)
        fraction = self.config.faulty_sessions
        faulty = math.floor((n + 1) * fraction) > math.floor(n * fraction)
        sess = SessionModel(topic=topic, session=f"{topic}-{number:04d}", faulty=faulty)
        self.sessions.append(sess)
        return sess

    def _site_of(self, sess: SessionModel) -> int:
        return int(sess.topic[len(self.config.topic_prefix) :])

    def _ts(self) -> float:
        return round(self.config.start_ts + self.messages * self.config.ts_step, 6)

    def _row(self, row_id: str) -> Row:
        rnd = self._rnd
        return {
            "id": row_id,
            "name": f"{_NAMES[int(rnd() * 8)]}-{int(rnd() * 100)}",
            # Integer thousandths keep the JSON short and its float round trip exact.
            "value": (int(rnd() * 2_000_000) - 1_000_000) / 1000,
            "count": int(rnd() * 100_000),
        }

    def _new_row_id(self, sess: SessionModel) -> str:
        row_id = f"r{sess.next_row}"
        sess.next_row += 1
        return row_id

    def _put(self, sess: SessionModel, row: Row) -> None:
        row_id = row["id"]
        if row_id not in sess.table:
            sess.ids.append(row_id)
        sess.table[row_id] = row

    def _remove(self, sess: SessionModel, index: int) -> str:
        ids = sess.ids
        row_id = ids[index]
        ids[index] = ids[-1]
        ids.pop()
        del sess.table[row_id]
        return row_id

    def _next_message(self, sess: SessionModel) -> tuple[str, bytes]:
        """Advance ``sess`` by one message (its intended effect on the table); type and value."""
        rnd = self._rnd
        sess.messages += 1
        restart = self.config.restart_every
        if sess.seq < 0 or (restart and sess.since_snapshot >= restart):
            return "snapshot", self._snapshot(sess)
        seq = sess.seq = sess.seq + 1
        sess.since_snapshot += 1
        ts = self._ts()
        name = sess.session
        end_p = self.config.end_probability
        if end_p and sess.since_snapshot > 1 and rnd() < end_p:
            return "end", _encode({"type": "end", "session": name, "seq": seq, "ts": ts})
        draw = rnd()
        ids = sess.ids
        if draw < self._p_insert or not ids:
            row = self._row(self._new_row_id(sess))
            self._put(sess, row)
            mtype = "insert"
            msg = {"type": mtype, "session": name, "seq": seq, "ts": ts, "row": row}
        elif draw < self._p_update:
            row = self._row(ids[int(rnd() * len(ids))])
            self._put(sess, row)
            mtype = "update"
            msg = {"type": mtype, "session": name, "seq": seq, "ts": ts, "row": row}
        else:
            row_id = self._remove(sess, int(rnd() * len(ids)))
            mtype = "delete"
            msg = {"type": mtype, "session": name, "seq": seq, "ts": ts, "id": row_id}
        return mtype, _encode(msg)

    def _snapshot(self, sess: SessionModel) -> bytes:
        rng = self._rng
        if sess.seq < 0:
            for _ in range(self.config.rows_per_snapshot):
                self._put(sess, self._row(self._new_row_id(sess)))
        else:
            # A producer restart: its state moved on while it was down (rows changed, gone,
            # added), so a consumer that merges instead of replacing ends up wrong.
            for index in range(len(sess.ids) - 1, -1, -1):
                draw = rng.random()
                if draw < 0.1:
                    self._remove(sess, index)
                elif draw < 0.25:
                    self._put(sess, self._row(sess.ids[index]))
            for _ in range(rng.randrange(3)):
                self._put(sess, self._row(self._new_row_id(sess)))
        sess.seq = 0
        sess.since_snapshot = 1
        sess.snapshots += 1
        message = {
            "type": "snapshot",
            "session": sess.session,
            "seq": 0,
            "ts": self._ts(),
            "rows": [sess.table[row_id] for row_id in sess.ids],
        }
        return _encode(message)

    def _maybe_fault(
        self, out: list[SimRecord], sess: SessionModel, value: bytes, seq: int, mtype: str
    ) -> None:
        draw = self._rng.random()
        kind = None
        for cut, candidate in self._fault_cuts:
            if draw < cut:
                kind = candidate
                break
        if kind is None:
            self._emit(out, sess, value, seq, mtype=mtype)
        elif kind is FaultKind.DROP or kind is FaultKind.SWAP:
            sess.held = (kind, seq, value)  # Resolved by the session's next message.
        elif kind is FaultKind.DUPLICATE:
            self._emit(out, sess, value, seq)
            rec = self._emit(out, sess, value, seq, track=True)
            sess.faults.append(InjectedFault(kind, seq, rec.index))
            sess.clean_next = True
        else:
            rec = self._emit(out, sess, value[: len(value) // 2], seq, track=True)
            sess.faults.append(InjectedFault(kind, seq, rec.index))
            sess.clean_next = True

    def _emit(
        self,
        out: list[SimRecord],
        sess: SessionModel,
        value: bytes,
        seq: int,
        *,
        mtype: str = "",
        track: bool = False,
    ) -> SimRecord:
        index = self._next_index
        self._next_index = index + 1
        if sess.first_record is None:
            sess.first_record = index
            track = True
        if mtype == "snapshot":
            sess.last_snapshot_record = index
        sess.records += 1
        rec = SimRecord(index, sess.topic, sess.session.encode(), value, sess.session, seq, track)
        out.append(rec)
        return rec
