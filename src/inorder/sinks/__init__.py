"""Exactly-once output: Parquet datasets and Delta tables on local disk or S3."""

from inorder.sinks.base import BatchWriter, Sink, SinkError, WrittenFile
from inorder.sinks.delta import DeltaSink
from inorder.sinks.parquet import ParquetSink, committed_files, read_committed

__all__ = [
    "BatchWriter",
    "DeltaSink",
    "ParquetSink",
    "Sink",
    "SinkError",
    "WrittenFile",
    "committed_files",
    "read_committed",
]
