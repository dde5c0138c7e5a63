"""Moved to :mod:`inorder.storage.fs`; this name keeps imports of the old path working.

Deprecated: import ``inorder.storage.fs`` instead.
"""

from __future__ import annotations

from inorder.storage.fs import *  # noqa: F403
from inorder.storage.fs import __all__ as __all__
