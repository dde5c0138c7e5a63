"""The checkpoint's info file (``inorder-checkpoint.json``) as a typed record.

Written by the runner (id, pipeline identity, settings, identity history) and by ``inorder
repair`` (batch id offset, starting offsets, what the repair did, a pending repair). Every
field is optional in the file: a checkpoint written by an earlier release, or by a run that
stopped between two writes, reads with defaults for what it lacks. Keys this release does
not know are kept in :attr:`CheckpointInfo.extra` and written back unchanged, so an older
release never drops what a newer one recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from inorder.checkpoint.names import CHECKPOINT_FILE
from inorder.errors import InorderError
from inorder.storage import fs as sfs

#: The key of the pipeline identity (:class:`~inorder.pipeline.identity.PipelineIdentity`).
IDENTITY_FIELD = "pipeline"
#: The key of the settings the pipeline last ran with (``RecordedSettings``).
SETTINGS_FIELD = "settings"
#: Earlier identities, newest last (each ``{"until": ..., "pipeline": ...}``).
HISTORY_FIELD = "history"
#: How many earlier identities the file keeps.
HISTORY_KEPT = 20

_KNOWN = (
    "id",
    IDENTITY_FIELD,
    SETTINGS_FIELD,
    HISTORY_FIELD,
    "batch_offset",
    "startingOffsets",
    "repaired",
    "repair_pending",
)


class CheckpointInfoError(InorderError):
    """The checkpoint's info file exists but cannot be read as JSON."""


def _mapping(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class CheckpointInfo:
    """What the info file holds; ``None`` fields are absent from the file."""

    id: str | None = None
    """The checkpoint's id (sinks bind to it: :meth:`CheckpointLayout.ensure_owner`)."""
    identity: dict[str, Any] | None = None
    """The identity of the pipeline that last ran on the checkpoint, as JSON."""
    settings: dict[str, Any] | None = None
    """The settings it ran with, as JSON."""
    history: tuple[dict[str, Any], ...] = ()
    """Earlier identities of the pipeline, oldest first."""
    batch_offset: int | None = None
    """Set by a repair: the output's batch ids continue at ``batch_offset + batch id``."""
    starting_offsets: dict[str, dict[str, int]] | None = None
    """Set by a repair: where the source starts, per topic and partition id."""
    repaired: dict[str, Any] | None = None
    """Set by a repair: when, its backup, its failure points."""
    repair_pending: dict[str, Any] | None = None
    """Set while a repair is applied: the plan (``inorder run`` refuses the checkpoint)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this release does not know, kept as read."""

    @property
    def offset(self) -> int:
        """The batch id offset (0 when no repair set one)."""
        return self.batch_offset or 0

    @property
    def failure_points(self) -> dict[str, dict[str, int]]:
        """The last repair's failure points, per topic and partition id (empty: none)."""
        points = (self.repaired or {}).get("failure_points")
        return dict(points) if isinstance(points, Mapping) else {}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointInfo:
        """Parse the file's object; a field of the wrong type reads as absent."""
        owner = data.get("id")
        history = data.get(HISTORY_FIELD)
        offset = data.get("batch_offset")
        starting = data.get("startingOffsets")
        pending: dict[str, Any] | None = None
        if "repair_pending" in data:
            # Its presence is what counts: a repair that was started and did not finish.
            pending = _mapping(data["repair_pending"]) or {}
        return cls(
            id=owner if isinstance(owner, str) and owner else None,
            identity=_mapping(data.get(IDENTITY_FIELD)) or None,
            settings=_mapping(data.get(SETTINGS_FIELD)),
            history=tuple(h for h in history if isinstance(h, dict))
            if isinstance(history, list)
            else (),
            batch_offset=None if offset is None else int(offset),
            starting_offsets=_mapping(starting) or None,
            repaired=_mapping(data.get("repaired")),
            repair_pending=pending,
            extra={k: v for k, v in data.items() if k not in _KNOWN},
        )

    def to_json(self) -> dict[str, Any]:
        """The file's object (absent fields left out)."""
        out: dict[str, Any] = dict(self.extra)
        values: dict[str, Any] = {
            "id": self.id,
            IDENTITY_FIELD: self.identity,
            SETTINGS_FIELD: self.settings,
            HISTORY_FIELD: list(self.history) if self.history else None,
            "batch_offset": self.batch_offset,
            "startingOffsets": self.starting_offsets,
            "repaired": self.repaired,
            "repair_pending": self.repair_pending,
        }
        out.update({k: v for k, v in values.items() if v is not None})
        return out

    def with_identity(
        self,
        identity: dict[str, Any],
        settings: dict[str, Any],
        replaced: dict[str, Any] | None = None,
        until: str = "",
    ) -> CheckpointInfo:
        """The record after a run of ``identity`` with ``settings``; ``replaced``, the identity
        it replaces (when it changed), goes to the history, marked ``until``."""
        history = list(self.history)
        if replaced is not None:
            history.append({"until": until, IDENTITY_FIELD: replaced})
        return replace(
            self, identity=identity, settings=settings, history=tuple(history[-HISTORY_KEPT:])
        )

    def pipeline_part(self) -> CheckpointInfo:
        """Only what identifies the pipeline (a repaired checkpoint keeps it)."""
        return CheckpointInfo(identity=self.identity, settings=self.settings, history=self.history)

    @classmethod
    def read(cls, location: sfs.Location, path: str) -> CheckpointInfo | None:
        """The record in the file at ``path`` (``None``: no file yet)."""
        data = read_raw(location, path)
        return None if data is None else cls.from_json(data)

    def write(self, location: sfs.Location, path: str) -> None:
        """Replace the file at ``path`` with this record."""
        data = json.dumps(self.to_json(), indent=1, sort_keys=True).encode()
        sfs.write_bytes(location, path, data)


def read_raw(location: sfs.Location, path: str) -> dict[str, Any] | None:
    """The file's JSON object as read (``None``: no file); a damaged one is a named error."""
    data = sfs.read_bytes_if_exists(location, path)
    if data is None:
        return None
    where = location.uri.rstrip("/")
    try:
        info = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointInfoError(
            f"checkpoint {where}: {CHECKPOINT_FILE} is damaged ({exc}); restore it from "
            "a backup, or repair the checkpoint with `inorder repair PIPELINE`"
        ) from None
    if not isinstance(info, dict):
        raise CheckpointInfoError(
            f"checkpoint {where}: {CHECKPOINT_FILE} does not hold a JSON object"
        )
    return info


__all__ = [
    "HISTORY_FIELD",
    "IDENTITY_FIELD",
    "SETTINGS_FIELD",
    "CheckpointInfo",
    "CheckpointInfoError",
    "read_raw",
]
