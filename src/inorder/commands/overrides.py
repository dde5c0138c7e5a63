"""``--set SECTION.KEY=VALUE``: overriding one setting of a TOML pipeline from the command line."""

from __future__ import annotations

import sys
import tomllib
from typing import Any

from inorder.errors import ConfigError


def add_set_option(parser: Any, what: str = "override one setting of a TOML pipeline") -> None:
    """Add the repeatable ``--set`` option to a command's parser."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help=f"{what} (value parsed as TOML, else a string); repeatable",
    )


def parse_override(text: str) -> tuple[str, Any]:
    """One ``SECTION.KEY=VALUE`` as a dotted name and a TOML-parsed (else string) value."""
    dotted, sep, raw = text.partition("=")
    if not sep or "." not in dotted:
        raise ConfigError(f"--set expects SECTION.KEY=VALUE, not {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return dotted.strip(), value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """All ``--set`` values of a command line, later ones winning."""
    return dict(parse_override(item) for item in items)


def print_notes(notes: list[str]) -> None:
    """Tell the operator (on stderr, so JSON output stays clean) what settings are in use."""
    for note in notes:
        print(f"inorder: {note}", file=sys.stderr)
