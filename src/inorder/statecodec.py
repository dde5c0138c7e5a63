"""Deprecated home of :mod:`inorder.state.codec`; these names keep working from here."""

from __future__ import annotations

from inorder.state.codec import (
    FINGERPRINT_FORMAT,
    StateCodec,
    check_compatible,
    describe_changes,
    fingerprint,
    type_string,
    validate_state_type,
)

__all__ = [
    "FINGERPRINT_FORMAT",
    "StateCodec",
    "check_compatible",
    "describe_changes",
    "fingerprint",
    "type_string",
    "validate_state_type",
]
