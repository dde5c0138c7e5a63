"""What every inorder streaming query needs: trigger arguments and the checkpoint's id."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

from inorder.durations import parse_duration
from inorder.errors import ConfigError
from inorder.sinks import fs as sfs

#: The file holding a checkpoint's id (and what ``inorder repair`` adds to it).
CHECKPOINT_FILE = "inorder-checkpoint.json"


def trigger_kwargs(trigger: str) -> dict[str, Any]:
    """``DataStreamWriter.trigger`` arguments for an interval, available-now or once."""
    text = trigger.strip().lower()
    if text in ("available-now", "available_now", "availablenow"):
        return {"availableNow": True}
    if text == "once":
        return {"once": True}
    try:
        interval = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"trigger: {exc}; or 'available-now' / 'once'") from None
    return {"processingTime": f"{int(interval.total_seconds() * 1000)} milliseconds"}


def checkpoint_owner(checkpoint: str) -> str:
    """The checkpoint's id: created with the checkpoint, kept for its whole life.

    Sinks are bound to it (:meth:`inorder.sinks.base.Sink.bind`): batch ids restart with
    every checkpoint, so output committed under another id must not count as committed.
    """
    location = sfs.resolve(checkpoint)
    if not location.is_s3:
        try:
            location.filesystem.create_dir(location.root, recursive=True)
        except OSError as exc:
            raise ConfigError(f"checkpoint {checkpoint!r} is not writable: {exc}") from None
    path = location.join(CHECKPOINT_FILE)
    with contextlib.suppress(sfs.AlreadyExists):  # created by an earlier run: keep it
        sfs.put_if_absent(location, path, json.dumps({"id": uuid.uuid4().hex}).encode())
    owner: str = json.loads(sfs.read_bytes(location, path))["id"]
    return owner
