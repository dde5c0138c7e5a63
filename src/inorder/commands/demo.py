"""``inorder demo``: the main job end to end on embedded defaults."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from inorder.commands.common import add_command

EXAMPLES = """examples:
  inorder demo                         3 sites, 60k messages, session tables as Parquet
  inorder demo --messages 200000 --faulty-sessions 0.1
  inorder demo --keep-running          leave the broker running afterwards
"""


def register(subparsers: Any) -> None:
    """Add the ``demo`` command."""
    parser = add_command(
        subparsers,
        "demo",
        help="run the main job end to end on a local broker and check it",
        description="Start the local broker, simulate collection sites publishing "
        "snapshot/update sessions, run the session-table pipeline until caught up, print a "
        "summary and check the rebuilt tables against the simulator's ground truth "
        "(exit 1 on any difference).",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--dir",
        default=".inorder/demo",
        help="where output, checkpoint and "
        "ground truth go (default .inorder/demo; each run gets a subdirectory)",
    )
    parser.add_argument(
        "--state-dir", default=None, help="dev services state directory (default .inorder/dev)"
    )
    parser.add_argument("--sites", type=int, default=3, help="collection sites (topics)")
    parser.add_argument("--sessions-per-site", type=int, default=40, help="sessions per site")
    parser.add_argument("--messages", type=int, default=60000, help="messages to produce")
    parser.add_argument(
        "--faulty-sessions",
        type=float,
        default=0.1,
        help="fraction of sessions that get injected faults",
    )
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the broker running when done (default: stop it if this command started it)",
    )
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the demo; 0 when the output matches the ground truth."""
    from inorder.demo import DemoSettings, run_demo

    settings = DemoSettings(
        base_dir=Path(args.dir),
        state_dir=Path(args.state_dir) if args.state_dir else None,
        sites=args.sites,
        sessions_per_site=args.sessions_per_site,
        messages=args.messages,
        faulty_sessions=args.faulty_sessions,
        master=args.master,
        keep_running=args.keep_running,
    )
    return 0 if run_demo(settings) else 1
