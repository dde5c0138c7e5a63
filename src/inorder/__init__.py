"""inorder: ordered, stateful stream processing for PySpark.

Kafka records applied in exact offset order to typed state, each topic-partition in one
Spark task, landed exactly once as Parquet or Delta. The public API::

    from inorder import (Pipeline, KafkaSource, Processor, Context, Violation, Integrity,
                         JsonCodec, RawCodec, ParquetSink, DeltaSink, SessionTables)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inorder.archive.initial_state import InitialState
    from inorder.codecs import (
        AvroCodec,
        Codec,
        DecodeError,
        JsonCodec,
        JsonSchemaCodec,
        ProtobufCodec,
        RawCodec,
        RawMessage,
        SchemaRegistry,
    )
    from inorder.errors import ConfigError, DataLossError, InorderError, IntegrityError
    from inorder.integrity import Integrity
    from inorder.kafka.api import KafkaSource
    from inorder.pipeline.observer import RunObserver
    from inorder.pipeline.pipeline import Pipeline
    from inorder.pipeline.progress import RunSummary
    from inorder.processor import Context, Duplicate, Processor, Violation
    from inorder.sessions import SessionChange, SessionTables, rebuild_tables
    from inorder.sessions.tables_writer import TableOutputs
    from inorder.sinks.base import Sink
    from inorder.sinks.delta import DeltaSink
    from inorder.sinks.iceberg import IcebergSink
    from inorder.sinks.parquet import ParquetSink
    from inorder.state.store import StateOptions

# Names are imported on first use: Spark's data source planner processes import
# ``inorder.kafka.source`` (and so this package) once per query, and importing the sinks
# (pyarrow.dataset, pandas, deltalake) eagerly cost ~0.9 s there.
_EXPORTS = {
    "AvroCodec": "inorder.codecs",
    "Codec": "inorder.codecs",
    "DecodeError": "inorder.codecs",
    "JsonSchemaCodec": "inorder.codecs",
    "ProtobufCodec": "inorder.codecs",
    "SchemaRegistry": "inorder.codecs",
    "JsonCodec": "inorder.codecs",
    "RawCodec": "inorder.codecs",
    "RawMessage": "inorder.codecs",
    "ConfigError": "inorder.errors",
    "DataLossError": "inorder.errors",
    "InorderError": "inorder.errors",
    "IntegrityError": "inorder.errors",
    "InitialState": "inorder.archive.initial_state",
    "Integrity": "inorder.integrity",
    "KafkaSource": "inorder.kafka.api",
    "Pipeline": "inorder.pipeline.pipeline",
    "RunObserver": "inorder.pipeline.observer",
    "RunSummary": "inorder.pipeline.progress",
    "Context": "inorder.processor",
    "Duplicate": "inorder.processor",
    "Processor": "inorder.processor",
    "Violation": "inorder.processor",
    "SessionChange": "inorder.sessions",
    "SessionTables": "inorder.sessions",
    "rebuild_tables": "inorder.sessions",
    "TableOutputs": "inorder.sessions.tables_writer",
    "StateOptions": "inorder.state.store",
    "Sink": "inorder.sinks.base",
    "DeltaSink": "inorder.sinks.delta",
    "IcebergSink": "inorder.sinks.iceberg",
    "ParquetSink": "inorder.sinks.parquet",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'inorder' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__version__ = "0.1.0"

__all__ = [
    "AvroCodec",
    "Codec",
    "ConfigError",
    "Context",
    "DataLossError",
    "DecodeError",
    "DeltaSink",
    "Duplicate",
    "IcebergSink",
    "InitialState",
    "InorderError",
    "Integrity",
    "IntegrityError",
    "JsonCodec",
    "JsonSchemaCodec",
    "KafkaSource",
    "ParquetSink",
    "Pipeline",
    "Processor",
    "ProtobufCodec",
    "RawCodec",
    "RawMessage",
    "RunObserver",
    "RunSummary",
    "SchemaRegistry",
    "SessionChange",
    "SessionTables",
    "Sink",
    "StateOptions",
    "TableOutputs",
    "Violation",
    "rebuild_tables",
]
