"""Deprecated home of :mod:`inorder.state.codec`; its names keep working from here."""

from __future__ import annotations

from inorder.state.codec import *  # noqa: F403
from inorder.state.codec import __all__ as __all__
