"""Snapshot/update session tables: the processor, its codec, change-log rebuild, full tables."""

from inorder.sessions.debezium import Debezium, DebeziumCodec
from inorder.sessions.envelopes import FieldMapping
from inorder.sessions.materializer import read_materialized
from inorder.sessions.messages import (
    Change,
    Delete,
    End,
    Insert,
    SessionCodec,
    SessionMessage,
    Snapshot,
    Update,
)
from inorder.sessions.processor import SessionChange, SessionTables
from inorder.sessions.rebuild import rebuild_tables, rebuild_tables_duckdb
from inorder.sessions.session_state import SessionState

__all__ = [
    "Change",
    "Debezium",
    "DebeziumCodec",
    "Delete",
    "End",
    "FieldMapping",
    "Insert",
    "SessionChange",
    "SessionCodec",
    "SessionMessage",
    "SessionState",
    "SessionTables",
    "Snapshot",
    "Update",
    "read_materialized",
    "rebuild_tables",
    "rebuild_tables_duckdb",
]
