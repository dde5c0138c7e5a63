"""What every inorder streaming query needs: trigger arguments and the checkpoint's id."""

from __future__ import annotations

from typing import Any

from inorder.checkpoint.layout import CheckpointLayout
from inorder.checkpoint.names import CHECKPOINT_FILE
from inorder.durations import parse_duration
from inorder.errors import ConfigError

__all__ = ["CHECKPOINT_FILE", "checkpoint_owner", "trigger_kwargs"]


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


def checkpoint_owner(checkpoint: CheckpointLayout) -> str:
    """The checkpoint's id (see :meth:`CheckpointLayout.ensure_owner`)."""
    return checkpoint.ensure_owner()
