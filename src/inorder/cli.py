"""The ``inorder`` command line: thin; each command lives in :mod:`inorder.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from inorder.errors import InorderError

#: Command modules; each defines ``register(subparsers) -> None`` and sets ``func`` defaults.
COMMAND_MODULES = (
    "dev",
    "simulate",
    "run",
    "demo",
    "validate",
    "verify",
    "replay",
    "repair",
    "inspect",
    "ui",
    "compact",
    "cluster",
    "package",
    "archive",
    "prepare",
)

EPILOG = """examples:
  inorder dev up                      start the local broker and S3 server
  inorder simulate --sites 3 --messages 100000
  inorder run examples/sessions.toml  run a pipeline until stopped
  inorder <command> --help            options of one command
"""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: every command module that exists, or only the command ``only``.

    Command modules import what their commands need (pyarrow, deltalake, ...): loading all
    of them costs about half a second, which ``inorder run`` would spend before its session
    starts. ``only`` loads one (unknown names load all, so argparse can list the choices).
    """
    parser = argparse.ArgumentParser(
        prog="inorder",
        description="Ordered, stateful stream processing for PySpark: Kafka records applied "
        "in exact offset order to typed state, landed exactly once as Parquet or Delta.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = (only,) if only in COMMAND_MODULES else COMMAND_MODULES
    for name in names:
        try:
            module = importlib.import_module(f"inorder.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"inorder.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, run the command, print errors as one line, return the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=words[0] if words else None)
    args = parser.parse_args(words)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = args.func(args)
    except InorderError as exc:
        print(f"inorder: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("inorder: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`inorder inspect ... | head`): stop quietly, as a command
        # killed by SIGPIPE would; stdout goes to /dev/null so the exit flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
