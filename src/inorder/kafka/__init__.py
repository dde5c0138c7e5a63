"""Kafka source: a PySpark streaming data source reading each topic-partition in offset order.

``KafkaSource`` is what pipelines configure; ``spark.readStream.format("inorder-kafka")`` is
the underlying data source (see docs/kafka-source.md).
"""

from inorder.kafka.api import KafkaSource

__all__ = ["KafkaSource"]
