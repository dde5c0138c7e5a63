"""The seed's job, vanilla: inorder's source -> groupBy(session).applyInPandasWithState with a
lenient, order-trusting state function (no sort, no checks) -> Parquet. Sorts forced to spill.

    python examples/vanilla_seed_bug.py BOOTSTRAP PATTERN OUTPUT CHECKPOINT [--sort]

The seed's bug reproduced: ``tests/e2e/test_seed_bug.py`` runs it beside inorder on the
same input. The benchmark baseline (same reconstruction, strict checks) is
``bench/vanilla_sessions.py``.

With ``--sort`` the function first sorts the rows it gets by offset (the fix inorder's spark
backend applies); without it, it applies them in the order Spark delivers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.state import GroupStateTimeout

from inorder.pipeline.spark import build_spark_session

OUTPUT = (
    "topic string, partition int, offset long, session string, op string, row_id string, row string"
)


SORT = "--sort" in sys.argv


def apply(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    table: dict[str, str] = json.loads(state.get[0]) if state.exists else {}
    out: list[tuple[Any, ...]] = []
    frames: Any = pdfs
    if SORT:
        frames = [pd.concat(list(pdfs)).sort_values(["partition", "offset"], kind="stable")]
    for pdf in frames:  # without --sort: trusts Spark's order, as the seed's job did
        for topic, partition, offset, value in zip(
            pdf["topic"], pdf["partition"], pdf["offset"], pdf["value"], strict=True
        ):
            try:
                msg = json.loads(value)
            except ValueError:
                continue
            kind = msg["type"]
            if kind == "snapshot":
                table.clear()
                out.append((topic, partition, offset, key[0], "clear", None, None))
                for row in msg["rows"]:
                    table[str(row["id"])] = json.dumps(row, sort_keys=True)
                    out.append(
                        (
                            topic,
                            partition,
                            offset,
                            key[0],
                            "insert",
                            str(row["id"]),
                            table[str(row["id"])],
                        )
                    )
            elif kind in ("insert", "update"):
                rid = str(msg["row"]["id"])
                table[rid] = json.dumps(msg["row"], sort_keys=True)
                out.append((topic, partition, offset, key[0], kind, rid, table[rid]))
            elif kind == "delete":
                rid = str(msg["id"])
                if table.pop(rid, None) is not None:
                    out.append((topic, partition, offset, key[0], "delete", rid, None))
    state.update((json.dumps(table),))
    yield pd.DataFrame(out, columns=[c.split()[0] for c in OUTPUT.split(", ")])


def main() -> None:
    bootstrap, pattern, output, checkpoint = sys.argv[1:5]
    spark = build_spark_session(
        "local[2]",
        app_name="naive-vanilla",
        conf={
            "spark.shuffle.spill.numElementsForceSpillThreshold": "50",
            "spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    df = (
        spark.readStream.format("inorder-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribePattern", pattern)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(
            "topic",
            "partition",
            "offset",
            "CAST(value AS STRING) AS value",
            "CAST(key AS STRING) AS session",
        )
    )
    changes = df.groupBy("session").applyInPandasWithState(
        apply, OUTPUT, "table string", "append", GroupStateTimeout.NoTimeout
    )
    query = (
        changes.writeStream.foreachBatch(
            lambda batch, batch_id: batch.write.mode("append").parquet(f"{output}/b={batch_id}")
        )
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
