"""``inorder dev up|down|status``: the local Kafka broker, S3 server and schema registry."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from inorder.commands.common import add_command, add_command_group, add_state_dir_option
from inorder.dev import services
from inorder.endpoints import (
    ENV_KAFKA,
    ENV_S3_ENDPOINT,
    ENV_SCHEMA_REGISTRY,
    ENV_STATE_DIR,
    resolve_state_dir,
)

EXAMPLES = """examples:
  inorder dev up                         start all three on 127.0.0.1: Kafka :9092, S3 :8333,
                                         schema registry :8081
  inorder dev status                     health of each (exit 1 if one is not healthy)
  inorder dev down                       stop exactly the processes `up` started
  inorder dev up --help                  options of one subcommand
"""

UP_EXAMPLES = """examples:
  inorder dev up
  inorder dev up --json                       machine-readable summary (secret masked)
  inorder dev up --json --show-secrets        ... including the S3 secret access key
  inorder dev up --kafka-port 19092 --s3-port 18333 --registry-port 18081
  inorder dev up --kafka-port 0               any free port (recorded for the next up)
  inorder dev up --only kafka                 just the broker (or: --only s3, --only registry)
  inorder dev up --bucket demo                create/use bucket 'demo' instead of 'inorder'
  inorder dev up --state-dir /tmp/inorder-dev  data, logs and services.json there

S3 credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY if set, else the ones recorded by an
earlier `up` in this state directory, else generated randomly. They are kept in
<state-dir>/services.json (mode 0600); other inorder commands read them from there.
"""

DOWN_EXAMPLES = """examples:
  inorder dev down
  inorder dev down --only s3                  stop just the S3 server
  inorder dev down --json
  inorder dev down --state-dir /tmp/inorder-dev
"""

STATUS_EXAMPLES = """examples:
  inorder dev status                          exit 0 only if every selected service is healthy
  inorder dev status --only kafka
  inorder dev status --json
  inorder dev status --show-secrets           also print the S3 secret access key
  inorder dev status --state-dir /tmp/inorder-dev
"""

MASK = "********"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} out of range (0-65535; 0 = any free)")
    return value


def _common(parser: argparse.ArgumentParser, *, secrets: bool) -> None:
    add_state_dir_option(
        parser,
        holds="data, logs and services.json",
        env=ENV_STATE_DIR,
        default=".inorder/dev in the current directory",
        example="/tmp/inorder-dev",
    )
    parser.add_argument(
        "--only",
        choices=services.SERVICES,
        help="act on one service only (kafka, s3 or registry), e.g. --only kafka",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON object instead of text, e.g. --json"
    )
    if secrets:
        parser.add_argument(
            "--show-secrets",
            action="store_true",
            help="print the S3 secret access key (masked otherwise), e.g. --show-secrets",
        )


def register(subparsers: Any) -> None:
    """Add the ``dev`` command with its ``up``, ``down`` and ``status`` subcommands."""
    sub = add_command_group(
        subparsers,
        "dev",
        "dev_command",
        help="start/stop/check the local Kafka broker, S3 server and schema registry",
        description="Local development services on 127.0.0.1: a Kafka-protocol broker "
        "(noida-db), an S3 server (SeaweedFS) with credentials and a bucket, and a "
        "Confluent-compatible schema registry. Other inorder commands find them through "
        "<state-dir>/services.json; INORDER_KAFKA_BOOTSTRAP_SERVERS, INORDER_S3_ENDPOINT "
        "(+ AWS_*) and INORDER_SCHEMA_REGISTRY_URL point them at external services instead.",
        epilog=EXAMPLES,
    )
    up = add_command(
        sub,
        "up",
        help="start the services (idempotent: running ones are left alone)",
        description="Start the broker, the S3 server and the schema registry unless already "
        "running, create the bucket, and print the endpoints and credentials.",
        epilog=UP_EXAMPLES,
    )
    _common(up, secrets=True)
    up.add_argument(
        "--kafka-port",
        type=_port,
        metavar="N",
        help="broker port (default: the last one used, else 9092; 0 = any free port), "
        "e.g. --kafka-port 19092",
    )
    up.add_argument(
        "--s3-port",
        type=_port,
        metavar="N",
        help="S3 port (default: the last one used, else 8333; 0 = any free port), "
        "e.g. --s3-port 18333",
    )
    up.add_argument(
        "--registry-port",
        type=_port,
        metavar="N",
        help="schema registry port (default: the last one used, else 8081; 0 = any free "
        "port), e.g. --registry-port 18081",
    )
    up.add_argument(
        "--bucket",
        metavar="NAME",
        help="bucket to create (default: the last one used, else 'inorder'), e.g. --bucket demo",
    )
    up.set_defaults(func=handle_up)

    down = add_command(
        sub,
        "down",
        help="stop the services this state directory started",
        description="Stop exactly the processes `inorder dev up` started (checked by pid and "
        "start time). Data, ports and credentials are kept for the next `up`.",
        epilog=DOWN_EXAMPLES,
    )
    _common(down, secrets=False)
    down.set_defaults(func=handle_down)

    status = add_command(
        sub,
        "status",
        help="report health (TCP + Kafka metadata; S3 ListBuckets; registry GET /subjects)",
        description="Check each service: process alive, port open, Kafka metadata request / "
        "S3 ListBuckets with the recorded credentials / registry GET /subjects. Exit 0 only "
        "if all are healthy.",
        epilog=STATUS_EXAMPLES,
    )
    _common(status, secrets=True)
    status.set_defaults(func=handle_status)


def _only(args: argparse.Namespace) -> list[str] | None:
    return [args.only] if args.only else None


def handle_up(args: argparse.Namespace) -> int:
    """``inorder dev up``."""
    state_dir = resolve_state_dir(args.state_dir)
    reports = services.up(
        state_dir,
        kafka_port=args.kafka_port,
        s3_port=args.s3_port,
        registry_port=args.registry_port,
        only=_only(args),
        bucket=args.bucket,
        credentials=_env_credentials(),
    )
    _print(state_dir, reports, args)
    return 0


def handle_down(args: argparse.Namespace) -> int:
    """``inorder dev down``."""
    state_dir = resolve_state_dir(args.state_dir)
    reports = services.down(state_dir, only=_only(args))
    _print(state_dir, reports, args)
    return 0


def handle_status(args: argparse.Namespace) -> int:
    """``inorder dev status``: exit 0 if every selected service is healthy, else 1."""
    state_dir = resolve_state_dir(args.state_dir)
    reports = services.status(state_dir, only=_only(args))
    _print(state_dir, reports, args)
    return 0 if all(r.healthy for r in reports) else 1


def _env_credentials() -> tuple[str, str] | None:
    key_id = os.environ.get("AWS_ACCESS_KEY_ID")
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    return (key_id, secret) if key_id and secret else None


#: Fields of a services.json entry shown to users, per service (no internals, no pids).
_PUBLIC = {
    "kafka": ("bootstrap_servers", "port", "data_dir", "log"),
    "s3": (
        "endpoint_url",
        "port",
        "bucket",
        "region",
        "access_key_id",
        "secret_access_key",
        "data_dir",
        "log",
    ),
    "registry": ("url", "port", "data_dir", "log"),
}


def _public(report: services.ServiceReport, show_secrets: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "state": report.state,
        "pid": report.pid,
        "healthy": report.healthy,
        "detail": report.detail,
    }
    for key in _PUBLIC[report.name]:
        if key in report.entry:
            out[key] = report.entry[key]
    if "secret_access_key" in out and not show_secrets:
        out["secret_access_key"] = MASK
    return out


def _print(
    state_dir: Path, reports: list[services.ServiceReport], args: argparse.Namespace
) -> None:
    show = bool(getattr(args, "show_secrets", False))
    command = args.dev_command
    if args.json:
        doc = {
            "command": command,
            "state_dir": str(state_dir.resolve()),
            "services": {r.name: _public(r, show) for r in reports},
        }
        print(json.dumps(doc, indent=2))
        return
    for r in reports:
        pid = f"pid {r.pid}" if r.pid else ""
        state = "already running" if r.detail == "already running" else r.state
        detail = "" if r.detail == "already running" else r.detail
        print(f"{r.name:<8} {state:<16} {pid:<10} {detail}".rstrip())
    if command == "down":
        return
    lines: list[tuple[str, str]] = []
    for r in reports:
        e = r.entry
        if r.state not in ("started", "running", "unhealthy"):
            continue
        if r.name == "kafka":
            lines.append(("Kafka bootstrap servers", str(e.get("bootstrap_servers"))))
        elif r.name == "registry":
            lines.append(("Schema registry URL", str(e.get("url"))))
        else:
            secret = str(e.get("secret_access_key")) if show else MASK + "  (--show-secrets)"
            lines += [
                ("S3 endpoint", str(e.get("endpoint_url"))),
                ("S3 bucket", f"{e.get('bucket')}  (s3://{e.get('bucket')}/)"),
                ("S3 region", str(e.get("region"))),
                ("S3 access key id", str(e.get("access_key_id"))),
                ("S3 secret access key", secret),
            ]
    if lines:
        print()
        for label, value in lines:
            print(f"  {label:<24} {value}")
        print(f"  {'state dir':<24} {state_dir}")
    for env in (ENV_KAFKA, ENV_S3_ENDPOINT, ENV_SCHEMA_REGISTRY):
        if os.environ.get(env):
            print(f"note: {env} is set, so other inorder commands use it, not these services")
