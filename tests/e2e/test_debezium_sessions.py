"""End to end: Debezium change events -> broker -> session-table pipeline -> exact tables."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
from tests.fixtures.sessions_job import sessions_config

from inorder.assemble import build_pipeline
from inorder.sessions.rebuild import read_changes, rebuild_tables

FIXTURES = Path(__file__).parents[1] / "fixtures" / "debezium"

Event = tuple[bytes | None, bytes | None]


def template(db: str, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / db / f"{name}.json").read_text())
    return doc


def stream(db: str, seed: int, rows: int, changes: int) -> tuple[list[Event], dict[str, Any]]:
    """A snapshot of ``rows`` rows then random creates/updates/deletes (each delete followed
    by its tombstone), in the shape of the ``db`` fixtures; and the table they leave."""
    rng = random.Random(seed)
    read = template(db, "read_first")["value"]
    change = template(db, "create")["value"]
    schema = next(v["schema"] for v in (read, change) if "schema" in v)
    read, change = (v.get("payload", v) for v in (read, change))
    table: dict[str, Any] = {}
    events: list[Event] = []
    position = 1000

    def emit(op: str, before: Any, after: Any, marker: str) -> None:
        nonlocal position
        position += 10
        base = read if op == "r" else change
        source = dict(base["source"], snapshot=marker)
        if "file" in source:
            source["pos"] = position
        else:
            source["sequence"] = json.dumps([str(position - 5), str(position)])
        rid = (after or before)["id"]
        value = {**base, "op": op, "before": before, "after": after, "source": source}
        if len(events) % 3 == 0:  # a third in the JSON converter's schema-bearing form
            value = {"schema": schema, "payload": value}
        key = msgspec.json.encode({"id": rid})
        events.append((key, msgspec.json.encode(value)))

    for i in range(rows):
        row = {"id": i, "name": f"row {i}", "n": 0}
        marker = "first" if i == 0 else "last" if i == rows - 1 else "true"
        emit("r", None, row, marker)
        table[str(i)] = row
    next_id = rows
    for _ in range(changes):
        kind = rng.random()
        if kind < 0.3 or not table:
            row = {"id": next_id, "name": f"row {next_id}", "n": 0}
            next_id += 1
            emit("c", None, row, "false")
            table[str(row["id"])] = row
        elif kind < 0.8:
            rid = rng.choice(sorted(table))
            row = {**table[rid], "n": table[rid]["n"] + 1}
            emit("u", {"id": row["id"]}, row, "false")
            table[rid] = row
        else:
            rid = rng.choice(sorted(table))
            emit("d", {"id": int(rid)}, None, "false")
            events.append((events[-1][0], None))  # the tombstone
            del table[rid]
    return events, table


def produce(bootstrap: str, topic: str, events: list[Event]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in events:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0, f"{topic}: not every event was delivered within 30 s"


def test_debezium_events_rebuild_exact_tables(kafka: Any, spark: Any, tmp_path: Path) -> None:
    prefix = f"dbz-{random.randrange(10**9)}-"
    topics = {
        "postgres": kafka.new_topic(f"{prefix}pg.inventory.customers"),
        "mysql": kafka.new_topic(f"{prefix}my.inventory.customers"),
    }
    sessions = {"postgres": "postgres.inventory.customers", "mysql": "inventory.customers"}
    expected = {}
    produced = 0
    for seed, (db, topic) in enumerate(topics.items()):
        events, table = stream(db, seed, rows=40, changes=300)
        produce(kafka.bootstrap_servers, topic, events)
        produced += len(events)
        expected[(topic, sessions[db])] = table
    config = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        name="e2e-debezium",
        max_offsets=150,
        processor={"type": "sessions", "options": {"envelope": {"kind": "debezium"}}},
    )
    summary = build_pipeline(config).run()
    assert summary.records == produced
    changes = read_changes(str(tmp_path / "output"))
    assert set(changes.column("op").to_pylist()) <= {"clear", "insert", "update", "delete"}
    assert rebuild_tables(changes) == expected
