"""inorder: ordered, stateful stream processing for PySpark.

Kafka records applied in exact offset order to typed state, one Spark task per
topic-partition, landed exactly once as Parquet or Delta. The public API::

    from inorder import (Pipeline, KafkaSource, Processor, Context, Violation, Integrity,
                         JsonCodec, RawCodec, ParquetSink, DeltaSink, SessionTables)
"""

from inorder.codecs import Codec, DecodeError, JsonCodec, RawCodec, RawMessage
from inorder.errors import ConfigError, DataLossError, InorderError, IntegrityError
from inorder.integrity import Integrity
from inorder.kafka.api import KafkaSource
from inorder.pipeline.pipeline import Pipeline
from inorder.pipeline.progress import RunSummary
from inorder.processor import Context, Processor, Violation
from inorder.sessions import SessionChange, SessionTables, rebuild_tables
from inorder.sinks.base import Sink
from inorder.sinks.delta import DeltaSink
from inorder.sinks.parquet import ParquetSink

__version__ = "0.1.0"

__all__ = [
    "Codec",
    "ConfigError",
    "Context",
    "DataLossError",
    "DecodeError",
    "DeltaSink",
    "InorderError",
    "Integrity",
    "IntegrityError",
    "JsonCodec",
    "KafkaSource",
    "ParquetSink",
    "Pipeline",
    "Processor",
    "RawCodec",
    "RawMessage",
    "RunSummary",
    "SessionChange",
    "SessionTables",
    "Sink",
    "Violation",
    "rebuild_tables",
]
