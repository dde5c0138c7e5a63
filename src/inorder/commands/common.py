"""What the commands share: the shape of their parsers, the options several of them take,
opening the pipeline a command names, and printing a report as text or JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inorder.commands.overrides import add_set_option, parse_overrides, print_notes

if TYPE_CHECKING:
    from inorder.ops.target import OpsTarget

PIPELINE_HELP = "pipeline TOML file, or module:attribute of a Pipeline"


def add_command(
    subparsers: Any,
    name: str,
    *,
    help: str,
    description: str | None = None,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """Add a command (or subcommand) whose description and examples print as written."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def add_command_group(
    subparsers: Any, name: str, dest: str, *, help: str, description: str, epilog: str
) -> Any:
    """Add a command made of subcommands (``inorder dev up``) and return its subparsers.

    The chosen subcommand's name lands in ``args.<dest>``; without one the command prints
    its help and exits 2.
    """
    parser = add_command(subparsers, name, help=help, description=description, epilog=epilog)
    sub = parser.add_subparsers(dest=dest, metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda _args: _print_help(parser))
    return sub


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def add_pipeline_command(
    subparsers: Any, name: str, *, help: str, description: str, epilog: str
) -> argparse.ArgumentParser:
    """Add a command on one pipeline: its first argument names the pipeline."""
    parser = add_command(subparsers, name, help=help, description=description, epilog=epilog)
    parser.add_argument("pipeline", help=PIPELINE_HELP)
    return parser


def add_run_set_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--set`` to a command that reads what ``inorder run`` wrote (the run's overrides)."""
    add_set_option(parser, "override a setting as `inorder run --set` did")


def add_state_dir_option(
    parser: argparse.ArgumentParser, *, holds: str, env: str, default: str, example: str
) -> None:
    """Add ``--state-dir DIR``: where a local service keeps what ``holds`` names."""
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help=f"where {holds} live (default: ${env} or {default}), e.g. --state-dir {example}",
    )


def open_target(args: argparse.Namespace) -> OpsTarget:
    """The pipeline ``args.pipeline`` names with its ``--set`` overrides, opened for reading
    its checkpoint and output; the settings notes go to stderr."""

    from inorder.assemble import load_target

    target = load_target(args.pipeline, parse_overrides(args.set))
    print_notes(target.notes)
    return target


def print_report(as_json: bool, doc: Any, lines: Callable[[], Iterable[str]]) -> None:
    """Print a report as indented, sorted JSON, or as the human lines ``lines()`` makes."""
    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print("\n".join(lines()))


def bootstrap_servers(given: str | None) -> str:
    """The Kafka bootstrap servers given on the command line, else the configured ones
    (``$INORDER_KAFKA_BOOTSTRAP_SERVERS``, else the ``inorder dev up`` broker)."""
    if given:
        return given
    from inorder.endpoints import kafka_bootstrap_servers

    return kafka_bootstrap_servers()
