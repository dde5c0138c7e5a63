"""The ground truth of a simulation: what a consumer of the simulated topics should find.

:func:`build_ground_truth` combines what :class:`~inorder.dev.sim_model.SiteModel` generated
with where the records landed (partitions and offsets from delivery reports) into a
:class:`GroundTruth`; :func:`write_ground_truth` and :func:`load_ground_truth` store and read
it as JSON, in the format described in ``docs/simulator.md``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inorder.dev.sim_config import FaultKind, SimulationConfig
from inorder.dev.sim_model import Row, SiteModel
from inorder.errors import ConfigError

GROUND_TRUTH_FORMAT = "inorder-simulation-ground-truth"
GROUND_TRUTH_VERSION = 1


@dataclass(frozen=True)
class FaultTruth:
    """An injected fault and the first record a consumer sees as violating the contract."""

    kind: FaultKind
    seq: int
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class SessionTruth:
    """What a consumer applying the contract should find for one session.

    ``table`` is the final table (row id -> row) when ``table_exact``; ``None`` when a fault
    came after the session's last snapshot (the consumer's table then depends on its policy).
    """

    topic: str
    session: str
    partition: int
    records: int
    last_seq: int
    snapshots: int
    ended: bool
    faulty: bool
    faults: tuple[FaultTruth, ...]
    table_exact: bool
    table: dict[str, Row] | None

    @property
    def key(self) -> str:
        """``<topic>/<session>``."""
        return f"{self.topic}/{self.session}"


@dataclass(frozen=True)
class TopicTruth:
    """One site topic: partitions, records produced, and end offsets after the run."""

    topic: str
    partitions: int
    late: bool
    records: int
    end_offsets: dict[int, int]


@dataclass(frozen=True)
class GroundTruth:
    """Everything a verifier needs to check a consumer of the simulated topics."""

    config: dict[str, Any]
    messages: int
    records: int
    late_activated_at: int | None
    topics: dict[str, TopicTruth]
    sessions: dict[str, SessionTruth]

    def faults(self) -> list[FaultTruth]:
        """All faults of all sessions."""
        return [f for s in self.sessions.values() for f in s.faults]

    def to_json(self) -> dict[str, Any]:
        """The JSON document (see ``docs/simulator.md``)."""
        return {
            "format": GROUND_TRUTH_FORMAT,
            "version": GROUND_TRUTH_VERSION,
            "config": self.config,
            "messages": self.messages,
            "records": self.records,
            "late_activated_at": self.late_activated_at,
            "topics": {
                name: {
                    "partitions": t.partitions,
                    "late": t.late,
                    "records": t.records,
                    "end_offsets": {str(p): o for p, o in sorted(t.end_offsets.items())},
                }
                for name, t in self.topics.items()
            },
            "sessions": {
                key: {
                    "topic": s.topic,
                    "session": s.session,
                    "partition": s.partition,
                    "records": s.records,
                    "last_seq": s.last_seq,
                    "snapshots": s.snapshots,
                    "ended": s.ended,
                    "faulty": s.faulty,
                    "faults": [
                        {
                            "kind": f.kind.value,
                            "seq": f.seq,
                            "topic": f.topic,
                            "partition": f.partition,
                            "offset": f.offset,
                        }
                        for f in s.faults
                    ],
                    "table_status": "exact" if s.table_exact else "unknown",
                    "table": s.table,
                }
                for key, s in self.sessions.items()
            },
        }


def build_ground_truth(
    config: SimulationConfig,
    model: SiteModel,
    positions: Mapping[int, tuple[int, int]],
    partitions: Mapping[str, int],
    end_offsets: Mapping[str, Mapping[int, int]],
) -> GroundTruth:
    """The ground truth of a finished run of ``model``.

    ``positions`` maps the index of every tracked record to its (partition, offset),
    ``partitions`` each topic to its partition count, ``end_offsets`` each topic's partitions
    to their end offsets after the run.
    """
    late = set(config.late_topics())
    by_topic: dict[str, int] = dict.fromkeys(partitions, 0)
    sessions: dict[str, SessionTruth] = {}
    for sess in model.sessions:
        if sess.first_record is None:
            continue  # Never picked: no record exists.
        by_topic[sess.topic] += sess.records
        partition = positions[sess.first_record][0]
        faults = []
        for fault in sess.faults:
            fpart, offset = positions[fault.record]
            faults.append(FaultTruth(fault.kind, fault.seq, sess.topic, fpart, offset))
        exact = sess.table_exact
        sessions[sess.key] = SessionTruth(
            topic=sess.topic,
            session=sess.session,
            partition=partition,
            records=sess.records,
            last_seq=sess.seq,
            snapshots=sess.snapshots,
            ended=sess.ended,
            faulty=sess.faulty,
            faults=tuple(faults),
            table_exact=exact,
            table={row_id: sess.table[row_id] for row_id in sorted(sess.table)} if exact else None,
        )
    topics = {
        name: TopicTruth(
            topic=name,
            partitions=partitions[name],
            late=name in late,
            records=by_topic[name],
            end_offsets=dict(end_offsets.get(name, {})),
        )
        for name in sorted(partitions)
    }
    return GroundTruth(
        config=config.as_dict(),
        messages=model.messages,
        records=model.records_emitted,
        late_activated_at=model.late_activated_at,
        topics=topics,
        sessions=sessions,
    )


def write_ground_truth(truth: GroundTruth, path: Path) -> None:
    """Write ``truth`` as JSON to ``path`` atomically (a reader never sees half a file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(truth.to_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write ground truth {path}: {exc.strerror}") from None


def load_ground_truth(path: str | os.PathLike[str]) -> GroundTruth:
    """Read a ground-truth file written by :func:`simulate`."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read ground truth {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"ground truth {path} is not JSON (line {exc.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != GROUND_TRUTH_FORMAT:
        raise ConfigError(f"{path} is not an inorder simulation ground truth")
    if doc.get("version") != GROUND_TRUTH_VERSION:
        raise ConfigError(
            f"ground truth {path} has version {doc.get('version')}, expected {GROUND_TRUTH_VERSION}"
        )
    try:
        topics = {
            name: TopicTruth(
                topic=name,
                partitions=int(t["partitions"]),
                late=bool(t["late"]),
                records=int(t["records"]),
                end_offsets={int(p): int(o) for p, o in t["end_offsets"].items()},
            )
            for name, t in doc["topics"].items()
        }
        sessions = {
            key: SessionTruth(
                topic=s["topic"],
                session=s["session"],
                partition=int(s["partition"]),
                records=int(s["records"]),
                last_seq=int(s["last_seq"]),
                snapshots=int(s["snapshots"]),
                ended=bool(s["ended"]),
                faulty=bool(s["faulty"]),
                faults=tuple(
                    FaultTruth(
                        kind=FaultKind(f["kind"]),
                        seq=int(f["seq"]),
                        topic=f["topic"],
                        partition=int(f["partition"]),
                        offset=int(f["offset"]),
                    )
                    for f in s["faults"]
                ),
                table_exact=s["table_status"] == "exact",
                table=s["table"],
            )
            for key, s in doc["sessions"].items()
        }
        return GroundTruth(
            config=doc["config"],
            messages=int(doc["messages"]),
            records=int(doc["records"]),
            late_activated_at=doc["late_activated_at"],
            topics=topics,
            sessions=sessions,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"ground truth {path} is malformed: {exc!r}") from None
