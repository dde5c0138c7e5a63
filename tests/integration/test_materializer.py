"""Materializer on real sinks (local disk and S3): change log in, full session tables out.

A random change log following the session-table rules (snapshots, row changes, ends, resets,
restarts) is committed batch by batch to a real sink; after each batch the materializer writes
its materializations. Every materialization must equal ``rebuild_tables`` of the change log up
to its batch; restarts and re-runs of a batch must neither lose nor duplicate one.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tests.integration.materialize_support import check_materializations, live_keys

from inorder.errors import ConfigError
from inorder.schema import output_schema
from inorder.sessions import SessionChange, SessionTables, rebuild_tables
from inorder.sessions.materializer import Materializer, read_materialized
from inorder.sessions.rebuild import read_changes
from inorder.sinks.base import Sink
from inorder.sinks.delta import DeltaSink
from inorder.sinks.parquet import ParquetSink

SCHEMA = output_schema(SessionChange)


@dataclass
class Item:
    """A typed row."""

    id: str
    v: int


TYPED_SCHEMA = output_schema(SessionTables(row_type=Item).out_type)
EVERY = 3


@dataclass
class _Session:
    topic: str
    partition: int
    name: str
    started: bool = False
    seq: int = -1
    rows: dict[str, str] = field(default_factory=dict)


class ChangeLog:
    """Generates change rows the way SessionTables would, batch by batch."""

    def __init__(self, seed: int, sessions: int = 24, typed: bool = False) -> None:
        self.typed = typed
        self.schema = TYPED_SCHEMA if typed else SCHEMA
        self.rng = random.Random(seed)
        self.sessions = [_Session(f"site-{i % 2}", i % 3, f"s{i:03d}") for i in range(sessions)]
        self.offsets: dict[tuple[str, int], int] = {}
        self._row = 0

    def _row_text(self, rid: str) -> str:
        self._row += 1
        return msgspec.json.encode({"id": rid, "v": self._row}).decode()

    def batch(self, batch_id: int, messages: int = 40) -> pa.Table:
        rows: list[dict[str, Any]] = []
        for _ in range(messages):
            s = self.rng.choice(self.sessions)
            where = (s.topic, s.partition)
            offset = self.offsets.get(where, 0)
            self.offsets[where] = offset + 1

            def emit(
                op: str,
                seq: int,
                rid: str | None = None,
                row: str | None = None,
                s: _Session = s,
                offset: int = offset,
            ) -> None:
                rows.append(
                    {
                        "topic": s.topic,
                        "partition": s.partition,
                        "offset": offset,
                        "kafka_ts": None,
                        "session": s.name,
                        "seq": seq,
                        "op": op,
                        "row_id": rid,
                        **self._row_columns(row),
                        "batch_id": batch_id,
                    }
                )

            roll = self.rng.random()
            if not s.started or roll < 0.05:
                if s.started and roll < 0.02:
                    s.started, s.rows = False, {}
                    emit("reset", -1)
                    continue
                s.started, s.seq = True, 0
                s.rows = {f"r{k}": self._row_text(f"r{k}") for k in range(self.rng.randint(0, 5))}
                emit("clear", 0)
                for rid, text in s.rows.items():
                    emit("insert", 0, rid, text)
                continue
            s.seq += 1
            if roll < 0.09:
                s.started = False
                emit("end", s.seq)
            elif roll < 0.5 or not s.rows:
                rid = f"r{self.rng.randint(5, 10**6)}"
                s.rows[rid] = self._row_text(rid)
                emit("insert", s.seq, rid, s.rows[rid])
            elif roll < 0.8:
                rid = self.rng.choice(sorted(s.rows))
                s.rows[rid] = self._row_text(rid)
                emit("update", s.seq, rid, s.rows[rid])
            else:
                rid = self.rng.choice(sorted(s.rows))
                del s.rows[rid]
                emit("delete", s.seq, rid)
        return pa.Table.from_pylist(rows, schema=self.schema)

    def _row_columns(self, row: str | None) -> dict[str, Any]:
        if not self.typed:
            return {"row": row}
        value = msgspec.json.decode(row) if row is not None else {"id": None, "v": None}
        return {"id": value["id"], "v": value["v"]}


def commit(sink: Sink, batch_id: int, table: pa.Table) -> None:
    """Commit one batch of change rows as the engine does (staged files, then commit)."""
    writer = sink.open_writer(table.schema, batch_id, f"task-{batch_id}")
    for batch in table.to_batches():
        writer.write(batch)
    assert sink.commit(batch_id, writer.close())


def read_all(sink: Any) -> pa.Table:
    """The whole dataset as any reader sees it (not through the sink's read API)."""
    return read_changes(sink.path, sink.storage_options)


@pytest.fixture(params=["local-parquet", "s3-delta"])
def sinks(request: Any, tmp_path: Path) -> Iterator[Callable[[str], Sink]]:
    if request.param == "local-parquet":
        yield lambda name: ParquetSink(str(tmp_path / name), partition_by=["topic"])
        return
    s3 = request.getfixturevalue("s3")
    prefix = s3.new_prefix()
    options = s3.storage_options()
    yield lambda name: DeltaSink(
        f"{prefix}/{name}", partition_by=["topic"], storage_options=options
    )


def test_materializations_equal_rebuilt_change_log_across_restarts(
    sinks: Callable[[str], Sink],
) -> None:
    log = ChangeLog(seed=7)
    changes_sink = sinks("changes")
    changes_sink.bind("owner-1")
    changes_sink.check(SCHEMA)

    def materializer() -> Materializer:
        output = sinks("tables")
        output.bind("owner-1")
        m = Materializer(SessionTables(), changes_sink, output, every=EVERY)
        m.check()
        return m

    m = materializer()
    batches = 11
    rebuilt = []
    for b in range(batches):
        commit(changes_sink, b, log.batch(b))
        if b == 4:
            m = materializer()  # a restart: tables rebuilt from change log alone
        if b == 7:
            m = materializer()  # a restart: from the periodic materialization of batch 5
        if b == 9:
            # Killed between the change log's commit and the materialization's: the re-run
            # of the batch materializes it; a re-run after that is a no-op.
            m = materializer()
        report = m.after_commit(b)
        rebuilt.append(report.rebuilt)
        if b == 9:
            again = materializer().after_commit(b)
            assert not again.committed and again.rebuilt
    assert rebuilt == [True, False, False, False, True, False, False, True, False, True, False]
    changes = changes_sink.read_batches(0, batches)
    output = m.output.read_batches(0, batches)
    assert output.num_rows == read_all(m.output).num_rows
    # The read API returns what a reader of the whole dataset sees.
    assert changes.num_rows == read_all(changes_sink).num_rows > 0
    counts = check_materializations(changes, output, batches, EVERY)
    assert counts["periodic"] > 20 and counts["end"] > 3 and counts["reset"] > 0, counts
    # Reading it back: the latest materialization of each session as of a periodic batch.
    upto = changes.filter(pc.less_equal(changes.column("batch_id"), 8))
    latest = read_materialized(output, as_of=8)
    for key in live_keys(upto):
        assert latest[key].reason == "periodic" and latest[key].batch_id == 8
        assert latest[key].rows == rebuild_tables(upto)[key]


def test_materializer_refuses_bad_settings(tmp_path: Path) -> None:
    sink = ParquetSink(str(tmp_path / "c"))
    with pytest.raises(ConfigError, match="materialize every"):
        Materializer(SessionTables(), sink, ParquetSink(str(tmp_path / "m")), every=0)


def test_typed_rows_are_materialized_as_columns(tmp_path: Path) -> None:
    log = ChangeLog(seed=3, sessions=10, typed=True)
    changes = ParquetSink(str(tmp_path / "changes"), partition_by=["topic"])
    changes.check(TYPED_SCHEMA)
    output = DeltaSink(str(tmp_path / "tables"), partition_by=["topic"])
    m = Materializer(SessionTables(row_type=Item), changes, output, every=2)
    m.check()
    for b in range(6):
        commit(changes, b, log.batch(b, messages=25))
        m.after_commit(b)
    written = output.read_batches(0, 5)
    assert written.schema.names == [
        "topic", "partition", "offset", "session", "seq", "row_id", "id", "v", "reason",
        "batch_id",
    ]  # fmt: skip
    assert written.schema.field("v").type == pa.int64()
    counts = check_materializations(changes.read_batches(0, 5), written, 6, 2)
    assert counts["periodic"] > 10 and counts["end"] > 0, counts


def test_parquet_read_batches_by_manifest_and_after_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inorder.sinks.compaction import compact_parquet

    log = ChangeLog(seed=5)
    sink = ParquetSink(str(tmp_path / "changes"), partition_by=["topic"])
    sink.check(SCHEMA)
    written = [log.batch(b, messages=20) for b in range(6)]
    for b, table in enumerate(written):
        commit(sink, b, table)

    def rows(table: pa.Table) -> list[tuple[Any, ...]]:
        cols = ("batch_id", "topic", "partition", "offset", "op", "row_id", "row")
        return sorted(zip(*(table.column(c).to_pylist() for c in cols), strict=True))

    expected = pa.concat_tables(written[2:5])
    import inorder.sinks.parquet as parquet_module

    with monkeypatch.context() as patch:

        def no_listing(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("a short range is read from its manifests")

        patch.setattr(parquet_module, "load_state", no_listing)
        assert rows(sink.read_batches(2, 4)) == rows(expected)
    assert rows(sink.read_batches(0, 10**6)) == rows(pa.concat_tables(written))
    assert sink.read_batches(7, 9).num_rows == 0
    assert sink.read_batches(3, 3, columns=["op"]).column_names == ["op"]
    report = compact_parquet(sink.path, grace_seconds=0, full=True)
    assert report.groups and report.files_after < report.files_before
    assert rows(sink.read_batches(2, 4)) == rows(expected)
