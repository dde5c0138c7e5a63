"""``inorder cluster up|down|status``: a Spark standalone cluster on 127.0.0.1."""

from __future__ import annotations

import argparse
import json
from typing import Any

from inorder.cluster.standalone import ENV_STATE_DIR, ClusterSpec, ClusterStatus, StandaloneCluster
from inorder.commands.common import add_command, add_command_group, add_state_dir_option

EXAMPLES = """examples:
  inorder cluster up                          master + 2 workers (1 core, 1g each)
  inorder cluster up --workers 3 --cores 2 --memory 2g
  inorder cluster status                      exit 0 only if every worker is ALIVE
  inorder run examples/sessions.toml --master "$(inorder cluster status --url)"
  inorder cluster down                        stop exactly the processes `up` started
"""


def _state_dir(parser: argparse.ArgumentParser) -> None:
    add_state_dir_option(
        parser,
        holds="cluster.json, logs and work dirs",
        env=ENV_STATE_DIR,
        default=".inorder/cluster",
        example="/tmp/inorder-cluster",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of text")


def register(subparsers: Any) -> None:
    """Add the ``cluster`` command with ``up``, ``down`` and ``status``."""
    sub = add_command_group(
        subparsers,
        "cluster",
        "cluster_command",
        help="start/stop/check a local Spark standalone cluster",
        description="A Spark standalone cluster (one Master, N Workers) on 127.0.0.1, started "
        "from the pip-installed pyspark with spark-class. Workers run this virtualenv's "
        "python. Stopping is by recorded pid and start time.",
        epilog=EXAMPLES,
    )
    up = add_command(
        sub,
        "up",
        help="start the master and workers (idempotent)",
        description="Start a master and --workers workers unless a healthy cluster is "
        "recorded in the state directory; wait until every worker registered.",
        epilog="examples:\n  inorder cluster up\n  inorder cluster up --workers 2 --cores 1 "
        "--memory 1g --state-dir /tmp/c\n",
    )
    _state_dir(up)
    up.add_argument("--workers", type=int, default=2, metavar="N", help="workers (default 2)")
    up.add_argument("--cores", type=int, default=1, metavar="N", help="cores per worker (1)")
    up.add_argument(
        "--memory", default="1g", metavar="SIZE", help="memory per worker, e.g. 1g or 1536m"
    )
    up.add_argument(
        "--master-port", type=int, default=0, metavar="PORT", help="master port (0: any free)"
    )
    up.add_argument(
        "--python",
        metavar="PATH",
        help="python the executors run (default: this interpreter)",
    )
    up.set_defaults(func=handle_up)

    down = add_command(sub, "down", help="stop the recorded master and workers")
    _state_dir(down)
    down.set_defaults(func=handle_down)

    status = add_command(sub, "status", help="health from the master's JSON UI")
    _state_dir(status)
    status.add_argument("--url", action="store_true", help="print only the master URL")
    status.set_defaults(func=handle_status)


def handle_up(args: argparse.Namespace) -> int:
    """``inorder cluster up``."""
    spec = ClusterSpec(
        workers=args.workers, cores=args.cores, memory=args.memory, master_port=args.master_port
    )
    if args.python:
        spec.python = args.python
    status = StandaloneCluster(args.state_dir).up(spec)
    _print(status, args)
    return 0 if status.healthy else 1


def handle_down(args: argparse.Namespace) -> int:
    """``inorder cluster down``."""
    stopped = StandaloneCluster(args.state_dir).down()
    if args.json:
        print(json.dumps({"stopped": stopped}))
    else:
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def handle_status(args: argparse.Namespace) -> int:
    """``inorder cluster status``: exit 0 only when healthy."""
    status = StandaloneCluster(args.state_dir).status()
    if args.url:
        if status.master_url and status.healthy:
            print(status.master_url)
    else:
        _print(status, args)
    return 0 if status.healthy else 1


def _print(status: ClusterStatus, args: argparse.Namespace) -> None:
    if args.json:
        doc = {
            "state": status.state,
            "master_url": status.master_url,
            "ui_url": status.ui_url,
            "alive_workers": status.alive_workers,
            "expected_workers": status.expected_workers,
            "detail": status.detail,
            "daemons": status.daemons,
        }
        print(json.dumps(doc, indent=2))
        return
    line = f"cluster {status.state}"
    if status.detail:
        line += f" ({status.detail})"
    print(line)
    if status.master_url:
        print(f"  master    {status.master_url}")
        print(f"  web UI    {status.ui_url}")
        print(f"  workers   {status.alive_workers} of {status.expected_workers} ALIVE")
    for daemon in status.daemons:
        alive = "alive" if daemon["alive"] else "gone"
        print(f"  {daemon['role']:<9} pid {daemon['pid']:<8} {alive:<6} log {daemon['log']}")
