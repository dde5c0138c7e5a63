"""Snapshot/update session tables: the built-in processor, its codec, and change-log rebuild."""

from inorder.sessions.messages import (
    Delete,
    End,
    Insert,
    SessionCodec,
    SessionMessage,
    Snapshot,
    Update,
)
from inorder.sessions.processor import SessionChange, SessionState, SessionTables
from inorder.sessions.rebuild import rebuild_tables, rebuild_tables_duckdb

__all__ = [
    "Delete",
    "End",
    "Insert",
    "SessionChange",
    "SessionCodec",
    "SessionMessage",
    "SessionState",
    "SessionTables",
    "Snapshot",
    "Update",
    "rebuild_tables",
    "rebuild_tables_duckdb",
]
