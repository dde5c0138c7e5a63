"""The checkpoint's owner lease: its home is :mod:`inorder.checkpoint.lease` (kept importable
here for code written against earlier releases)."""

from __future__ import annotations

from inorder.checkpoint.lease import (
    DEFAULT_DURATION,
    LEASE_FILE,
    CheckpointLease,
    LeaseHeld,
    LeaseLost,
    LeaseRecord,
    LeaseStore,
    LocalLeaseStore,
    S3LeaseStore,
    lease_store,
)

__all__ = [
    "DEFAULT_DURATION",
    "LEASE_FILE",
    "CheckpointLease",
    "LeaseHeld",
    "LeaseLost",
    "LeaseRecord",
    "LeaseStore",
    "LocalLeaseStore",
    "S3LeaseStore",
    "lease_store",
]
