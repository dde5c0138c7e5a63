"""``inorder ui PIPELINE``: serve a pipeline's live status page (read-only).

``inorder run PIPELINE --ui`` serves the same page beside the run (:func:`add_ui_options`
and :func:`start_ui` are shared with it).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from inorder.commands.common import add_pipeline_command, add_run_set_option, open_target

if TYPE_CHECKING:
    from inorder.ops.target import OpsTarget
    from inorder.pipeline.batch_history import BatchHistory
    from inorder.ui.server import UiServer

EXAMPLES = """examples:
  inorder ui pipeline.toml                        http://127.0.0.1:8765 (loopback only)
  inorder ui pipeline.toml --port 0               any free port (the URL is printed)
  INORDER_UI_TOKEN=s3cret inorder ui pipeline.toml --host 0.0.0.0 --allow-remote
  inorder run pipeline.toml --ui --ui-port 8765   the page beside a running pipeline
"""

#: The page's port when none is given.
DEFAULT_PORT = 8765


def add_ui_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add ``--host``, ``--port``, ``--token`` and ``--allow-remote`` (each after ``prefix``)."""
    parser.add_argument(
        f"--{prefix}host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; others need --allow-remote)",
    )
    parser.add_argument(
        f"--{prefix}port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port)",
    )
    parser.add_argument(
        f"--{prefix}token",
        metavar="T",
        help="require this token (default: $INORDER_UI_TOKEN; none: no token)",
    )
    parser.add_argument(
        f"--{'ui-' if prefix else ''}allow-remote",
        action="store_true",
        help="allow a non-loopback --host (prints a warning; use a token)",
    )


def register(subparsers: Any) -> None:
    """Add the ``ui`` command."""
    parser = add_pipeline_command(
        subparsers,
        "ui",
        help="serve a pipeline's live status page",
        description="Serve a read-only page showing, from the pipeline's checkpoint, its "
        "output and the broker: offsets and lag per partition, batch history charts, "
        "integrity events with the replay command for each, state and output sizes, and the "
        "settings (secrets masked). Works for a running or a stopped pipeline.",
        epilog=EXAMPLES,
    )
    add_ui_options(parser)
    add_run_set_option(parser)
    parser.set_defaults(func=handle)


def start_ui(
    reference: str,
    target: OpsTarget,
    args: argparse.Namespace,
    prefix: str = "",
    history: BatchHistory | None = None,
) -> UiServer:
    """Check the address, start the page's server, print its URL; return the server."""
    from inorder.ui.app import create_app
    from inorder.ui.server import TOKEN_ENV, UiServer, announce, check_bind
    from inorder.ui.status import StatusSource

    dest = prefix.replace("-", "_")
    host = getattr(args, f"{dest}host")
    token = getattr(args, f"{dest}token") or os.environ.get(TOKEN_ENV) or None
    allow = getattr(args, f"{dest}allow_remote")
    check_bind(host, allow, token, sys.stderr)
    source = StatusSource(reference, target, history)
    server = UiServer(create_app(source, token), host, getattr(args, f"{dest}port")).start()
    from urllib.parse import quote

    announce(server.url, f"/pipelines/{quote(source.name, safe='')}", token)
    return server


def handle(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    target = open_target(args)
    start_ui(args.pipeline, target, args).wait()
    return 0
