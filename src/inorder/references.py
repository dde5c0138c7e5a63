"""``module:attribute`` references in settings: one way to import them, one way to fail."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from inorder.errors import ConfigError


def import_reference(reference: str, what: str) -> Any:
    """The object ``module:attribute`` names; ``what`` is the setting, for the error.

    The current directory is importable, as for ``python -m``: a pipeline file's processor,
    codec or row type may live beside it. A reference that does not resolve is a
    :class:`~inorder.errors.ConfigError` naming the setting and what is missing.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{what}: expected 'module:attribute', not {reference!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{what}: cannot import module {module_name!r}: {exc}") from None
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{what}: module {module_name!r} has no {attribute!r}") from None
    return target


__all__ = ["import_reference"]
