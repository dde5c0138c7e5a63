"""``InitialState``: start a new pipeline checkpoint from a dataset of keys and states.

The dataset is any table with a key column, the ``topic`` and ``partition`` each key lives in
(a key's records come from one topic-partition), and state columns: e.g. the materialized
session tables of a previous job, or a table exported from another system. ``offsets`` says
which Kafka offsets that state corresponds to: per topic-partition, the first offset *not*
reflected in it. When the pipeline's checkpoint is new, the runner

1. writes the states as version -1 snapshots of the engine's state store
   (:func:`inorder.state.seed.seed_partition_state`), and
2. starts the source at ``offsets`` (``startingOffsets``).

A checkpoint that has run a batch is never seeded again: the state is its own from then on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from inorder.checkpoint.layout import CheckpointLayout
from inorder.errors import ConfigError
from inorder.records import TopicPartition
from inorder.state.entry import KeyEntry


@dataclass(frozen=True)
class InitialState:
    """Keys and states to start a new checkpoint with, and the offsets they correspond to.

    ``path`` is a committed inorder Parquet dataset (read with
    :func:`inorder.sinks.parquet.read_committed`); ``table`` gives the rows directly instead.
    ``offsets`` maps topic -> partition -> the first offset to read (a number per partition
    of the subscription; ``-2`` earliest, ``-1`` latest as in ``startingOffsets``).
    ``to_state(key, rows)`` builds one key's state from all of that key's rows (dicts), in
    table order; it may return a :class:`~inorder.state.entry.KeyEntry` to set engine fields
    too (last sequence number, a pending timer). Keys without rows start from
    ``processor.initial_state`` as usual. Without ``to_state`` the table holds engine rows
    (``state`` encoded by the state codec, ``last_offset``, ``seq``, ``timer``...): what
    :meth:`from_checkpoint` builds from another pipeline's checkpoint.
    """

    offsets: Mapping[str, Mapping[int | str, int]]
    to_state: Callable[[str, list[dict[str, Any]]], Any] | None = None
    path: str | None = None
    table: pa.Table | None = None
    key_column: str = "key"
    topic_column: str = "topic"
    partition_column: str = "partition"
    storage_options: Mapping[str, str] = field(default_factory=dict)

    def starting_offsets(self) -> dict[str, dict[str, int]]:
        """``offsets`` in ``startingOffsets`` form (string partition ids)."""
        return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in self.offsets.items()}

    def start_of(self, tp: TopicPartition) -> int | None:
        """The first offset to read for ``tp`` (``None``: not listed)."""
        parts = self.offsets.get(tp.topic, {})
        for p, offset in parts.items():
            if int(p) == tp.partition:
                return int(offset)
        return None

    def load(self) -> pa.Table:
        """The rows (the committed dataset, or ``table``)."""
        if (self.path is None) == (self.table is None):
            raise ConfigError("initial_state: give exactly one of path and table")
        if self.table is not None:
            return self.table
        from inorder.sinks.parquet import read_committed

        assert self.path is not None
        return read_committed(self.path, dict(self.storage_options) or None)

    @classmethod
    def from_checkpoint(
        cls, checkpoint: str | CheckpointLayout, batch_id: int | None = None
    ) -> InitialState:
        """The state another pipeline's checkpoint holds after ``batch_id`` (default: its last
        batch committed by Spark), with that batch's end offsets.

        States are decoded with the new pipeline's state type, so compatible changes (a new
        field with a default) migrate as they would in place.
        """
        from inorder.checkpoint.state_files import load_partition_state
        from inorder.state.checkpoint import CheckpointStore

        # The user names the other checkpoint here: where its path enters.
        layout = (
            checkpoint
            if isinstance(checkpoint, CheckpointLayout)
            else CheckpointLayout.of(checkpoint)
        )
        engine = CheckpointStore(layout.engine_dir)
        batches = layout.spark_log.batches()
        chosen = next(
            (
                b
                for b in reversed(batches)
                if b.committed and (batch_id is None or b.batch_id == batch_id)
            ),
            None,
        )
        if chosen is None:
            which = "any committed batch" if batch_id is None else f"committed batch {batch_id}"
            raise ConfigError(f"initial_state: checkpoint {layout.root!r} has no {which}")
        rows: list[dict[str, Any]] = []
        for tp in sorted(chosen.end):
            if not engine.versions(tp):
                continue
            state = load_partition_state(engine, tp, chosen.batch_id)
            for key, e in state.entries.items():
                rows.append(
                    {
                        "topic": tp.topic,
                        "partition": tp.partition,
                        "key": key,
                        "state": e.state,
                        "last_offset": e.last_offset,
                        "last_ts": e.last_ts,
                        "kafka_key": e.kafka_key,
                        "seq": e.seq,
                        "timer": e.timer,
                        "timer_kind": e.timer_kind,
                        "ignored": e.ignored,
                    }
                )
        offsets: dict[str, dict[int | str, int]] = {}
        for tp, end in chosen.end.items():
            offsets.setdefault(tp.topic, {})[tp.partition] = end
        schema = pa.schema(
            [
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("key", pa.string()),
                ("state", pa.binary()),
                ("last_offset", pa.int64()),
                ("last_ts", pa.int64()),
                ("kafka_key", pa.binary()),
                ("seq", pa.int64()),
                ("timer", pa.int64()),
                ("timer_kind", pa.int8()),
                ("ignored", pa.bool_()),
            ]
        )
        return cls(offsets=offsets, table=pa.Table.from_pylist(rows, schema=schema))

    def entries(
        self, decode: Callable[[bytes], Any] | None = None
    ) -> dict[TopicPartition, list[tuple[str, KeyEntry]]]:
        """Per topic-partition, each key's engine entry (built with ``to_state``, or from
        engine rows decoded with ``decode``)."""
        table = self.load()
        for col in (self.key_column, self.topic_column, self.partition_column):
            if col not in table.column_names:
                raise ConfigError(
                    f"initial_state: column {col!r} is not in the dataset "
                    f"(columns: {', '.join(table.column_names)})"
                )
        grouped: dict[tuple[TopicPartition, str], list[dict[str, Any]]] = {}
        for row in table.to_pylist():
            tp = TopicPartition(str(row[self.topic_column]), int(row[self.partition_column]))
            grouped.setdefault((tp, str(row[self.key_column])), []).append(row)
        out: dict[TopicPartition, list[tuple[str, KeyEntry]]] = {}
        for (tp, key), rows in grouped.items():
            start = self.start_of(tp)
            if start is None or start < 0:
                raise ConfigError(
                    f"initial_state: offsets give no starting offset for {tp} "
                    f"(key {key!r} lives there); the state must say where it ends"
                )
            if self.to_state is None:
                entry = _engine_entry(key, rows, decode)
            else:
                made = self.to_state(key, rows)
                entry = (
                    made if isinstance(made, KeyEntry) else KeyEntry(made, last_offset=start - 1)
                )
            out.setdefault(tp, []).append((key, entry))
        return out


def _engine_entry(
    key: str, rows: list[dict[str, Any]], decode: Callable[[bytes], Any] | None
) -> KeyEntry:
    """A key's entry from an engine row (see :meth:`InitialState.from_checkpoint`)."""
    if len(rows) != 1 or "state" not in rows[0]:
        raise ConfigError(
            f"initial_state: key {key!r}: without to_state the dataset must hold one engine row "
            "per key (a 'state' column of encoded state)"
        )
    if decode is None:
        raise ConfigError("initial_state: no state codec to decode engine rows with")
    row = rows[0]
    raw = row["state"]
    return KeyEntry(
        None if raw is None else decode(raw),
        int(row.get("last_offset", -1) if row.get("last_offset") is not None else -1),
        row.get("last_ts"),
        row.get("kafka_key"),
        row.get("seq"),
        row.get("timer"),
        int(row.get("timer_kind") or 0),
        bool(row.get("ignored") or False),
    )


def is_new_checkpoint(layout: CheckpointLayout) -> bool:
    """Whether no micro-batch has been planned in the checkpoint (Spark's offsets log empty)."""
    return not layout.planned_batches()


def with_starting_offsets(source: Any, initial: InitialState) -> Any:
    """``source`` (a ``KafkaSource``) starting at the initial state's offsets."""
    return dataclasses.replace(source, starting_offsets=json.dumps(initial.starting_offsets()))


def seed(backend: Any, initial: InitialState) -> dict[TopicPartition, int]:
    """Write the initial state into a checked backend's state store; keys per partition.

    Refuses a checkpoint whose state already has versions from batch 0 on.
    """
    from inorder.processor import processor_types
    from inorder.state.codec import StateCodec
    from inorder.state.seed import has_state, seed_partition_state

    checkpoint = backend.checkpoint
    meta = checkpoint.state_meta()
    if meta is None:
        raise ConfigError("initial_state: the engine's state metadata is missing (check() first)")
    codec = StateCodec(processor_types(backend.processor).state)
    by_tp = initial.entries(codec.decode)
    tps = [TopicPartition(t, int(p)) for t, parts in initial.offsets.items() for p in parts]
    if has_state(checkpoint, set(tps) | set(by_tp)):
        raise ConfigError(
            "initial_state: the checkpoint already holds processed state; "
            "initial state only applies to a new checkpoint"
        )
    written: dict[TopicPartition, int] = {}
    for tp in sorted(set(tps) | set(by_tp)):
        start = initial.start_of(tp)
        if start is None or start < 0:
            continue
        written[tp] = seed_partition_state(
            checkpoint, tp, by_tp.get(tp, []), codec, start, str(meta["epoch"])
        )
    return written


def seed_if_needed(backend: Any, pipeline: Any, seeding: bool) -> None:
    """Seed the backend's state from the pipeline's initial state when ``seeding``."""
    initial: InitialState | None = getattr(pipeline, "initial_state", None)
    if seeding and initial is not None:
        seed(backend, initial)
