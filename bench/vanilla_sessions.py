"""The session-table job written the way a PySpark user would without inorder (the baseline).

Same source (``inorder-kafka``), same reconstruction (the :class:`SessionTables` rules and
change rows), but with Spark's own stateful operator: ``groupBy(session)`` +
``applyInPandasWithState`` (RocksDB state store), and Spark's Parquet writer in
``foreachBatch``. State per session is the JSON of :class:`SessionState`.

Pitfall it reproduces on purpose: ``applyInPandasWithState`` does not promise the order of a
group's rows. With ``sort_by_offset=False`` (the default, what users write) the function
applies rows in the order Spark hands them over; when the shuffle sort spills
(``spark.shuffle.spill.numElementsForceSpillThreshold``) that order is not offset order and
sessions report sequence violations that are not in the data ("stuck" rows). With
``sort_by_offset=True`` the function sorts each group's rows by (partition, offset) first.

Usage from Python::

    from bench.vanilla_sessions import start_vanilla
    query = start_vanilla(spark, bootstrap, "site-.*", out_dir, checkpoint, max_offsets=100_000)
    query.awaitTermination()
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as a script, imported from the bench directory or as ``bench.<module>``: the shared
# session-job pieces live beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _session_rows import SessionContext

OUTPUT_DDL = (
    "topic string, partition int, offset long, kafka_ts timestamp, session string, seq long, "
    "op string, row_id string, row string"
)
STATE_DDL = "state string"


def session_function(sort_by_offset: bool = False) -> Any:
    """The ``applyInPandasWithState`` function: apply one session's rows, emit change rows."""

    def apply(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
        import msgspec
        import pandas as pd

        from inorder.codecs.base import DecodeError
        from inorder.processor import Violation
        from inorder.sessions.messages import SessionCodec
        from inorder.sessions.processor import SessionState, SessionTables

        processor = SessionTables(row_key="id")
        codec = SessionCodec("id")
        session = key[0]
        current = (
            msgspec.json.decode(state.get[0], type=SessionState) if state.exists else SessionState()
        )
        frames = list(pdfs)
        if not frames:
            return
        pdf = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        if sort_by_offset:
            pdf = pdf.sort_values(["partition", "offset"], kind="stable")
        ctx = SessionContext()
        out: dict[str, list[Any]] = {c: [] for c in OUTPUT_COLUMNS}
        for topic, partition, offset, value, ts in zip(
            pdf["topic"].tolist(),
            pdf["partition"].tolist(),
            pdf["offset"].tolist(),
            pdf["value"].tolist(),
            pdf["timestamp"].tolist(),
            strict=True,
        ):
            ctx.timestamp = None if ts is None or ts != ts else ts.to_pydatetime()
            try:
                msg = codec.decode(value, None)
                snapshot = msgspec.structs.replace(current, rows=dict(current.rows))
                changes = list(processor.process(snapshot, msg, ctx))
                current = snapshot
            except (Violation, DecodeError):
                # restart_session: the session's table is dropped, a reset row says so.
                current = SessionState()
                changes = list(processor.on_reset(session, Violation("x", "x"), ctx))  # type: ignore[arg-type]
            for c in changes:
                out["topic"].append(topic)
                out["partition"].append(partition)
                out["offset"].append(offset)
                out["kafka_ts"].append(c.kafka_ts)
                out["session"].append(c.session)
                out["seq"].append(c.seq)
                out["op"].append(c.op)
                out["row_id"].append(c.row_id)
                out["row"].append(c.row)
        state.update((msgspec.json.encode(current).decode(),))
        yield pd.DataFrame(out, columns=OUTPUT_COLUMNS)

    return apply


OUTPUT_COLUMNS = [c.split()[0] for c in OUTPUT_DDL.split(", ")]


def start_vanilla(
    spark: Any,
    bootstrap: str,
    topic_pattern: str,
    output: str,
    checkpoint: str,
    *,
    max_offsets: int | None = None,
    available_now: bool = True,
    sort_by_offset: bool = False,
) -> Any:
    """Start the baseline query (``inorder-kafka`` -> applyInPandasWithState -> Parquet)."""
    import _session_rows
    from pyspark import cloudpickle
    from pyspark.sql.streaming.state import GroupStateTimeout

    # Spark's workers cannot import the bench directory's modules: ship this one's classes.
    cloudpickle.register_pickle_by_value(_session_rows)

    # inorder's session defaults to Avro state encoding, which this operator does not support.
    spark.conf.set("spark.sql.streaming.stateStore.encodingFormat", "unsaferow")
    # The group function lives in this file: workers import it from here.
    spark.sparkContext.addPyFile(__file__)
    reader = (
        spark.readStream.format("inorder-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribePattern", topic_pattern)
        .option("startingOffsets", "earliest")
    )
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    df = reader.load().selectExpr(
        "topic", "partition", "offset", "timestamp", "value", "CAST(key AS STRING) AS session"
    )
    sessions = df.groupBy("session").applyInPandasWithState(
        session_function(sort_by_offset),
        OUTPUT_DDL,
        STATE_DDL,
        "append",
        GroupStateTimeout.NoTimeout,
    )

    def write(batch: Any, batch_id: int) -> None:
        batch.write.mode("append").parquet(f"{output}/batch={batch_id}")

    writer = sessions.writeStream.foreachBatch(write).option("checkpointLocation", checkpoint)
    trigger = {"availableNow": True} if available_now else {"processingTime": "1 second"}
    return writer.outputMode("append").trigger(**trigger).start()


def progress_of(query: Any) -> list[dict[str, Any]]:
    """The query's recent progress as dicts."""
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in query.recentProgress]


def now_utc() -> datetime:
    """The current time (UTC)."""
    return datetime.now(UTC)
