"""Run a streaming query over the inorder-kafka source that writes each micro-batch's
(topic, partition, offset) rows to ``OUT/batch-<id>.json`` (overwriting on re-run).

Usage: python kafka_exactly_once.py BOOTSTRAP TOPIC CHECKPOINT OUT MASTER run|drain

``run`` keeps going (500 ms trigger) until killed; ``drain`` reads what is there with
Trigger.AvailableNow and exits. Used by the kill -9 / restart tests.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    bootstrap, topic, checkpoint, out, master, mode = sys.argv[1:7]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from inorder.kafka import KafkaSource
    from inorder.pipeline.spark import build_spark_session

    spark = build_spark_session(master=master, app_name="kafka-exactly-once")
    # Small batches while the test kills the driver (more commit points to land a kill
    # between); the drain after it only has to read the rest, in as few batches as it takes.
    per_trigger = 700 if mode == "run" else 100_000
    source = KafkaSource(
        bootstrap_servers=bootstrap, topics=[topic], max_offsets_per_trigger=per_trigger
    )
    df = source.load(spark)
    os.makedirs(out, exist_ok=True)

    def write(batch_df: object, batch_id: int) -> None:
        rows = batch_df.select("topic", "partition", "offset").collect()  # type: ignore[attr-defined]
        tmp = os.path.join(out, f".batch-{batch_id:06d}.tmp")
        with open(tmp, "w") as fh:
            json.dump([[r.topic, r.partition, r.offset] for r in rows], fh)
        os.replace(tmp, os.path.join(out, f"batch-{batch_id:06d}.json"))
        print(f"batch {batch_id} rows {len(rows)}", flush=True)

    trigger = {"availableNow": True} if mode == "drain" else {"processingTime": "500 milliseconds"}
    query = (
        df.writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
