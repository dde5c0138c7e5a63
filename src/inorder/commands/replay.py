"""``inorder replay PIPELINE``: step through one topic-partition locally, with breakpoints."""

from __future__ import annotations

import argparse
from typing import Any

from inorder.commands.common import add_pipeline_command, add_run_set_option, open_target
from inorder.errors import ConfigError

EXAMPLES = """examples:
  inorder replay pipeline.toml --topic site-a --partition 0 --from-offset 100 --to-offset 140
  inorder replay pipeline.toml --topic site-a --partition 0 --key session-17
  inorder replay pipeline.toml --topic site-a --partition 0 --break-at-offset 1234
  inorder replay pipeline.toml --topic site-a --partition 0 --break-on-violation
  inorder replay pipeline.toml --topic site-a --partition 0 \\
      --break-when 'key == "s-3" and msg.seq > 40'
  inorder replay pipeline.toml --topic site-a --partition 0 --from-offset 900000 \\
      --from-checkpoint-version auto

Breakpoints call breakpoint() (PYTHONBREAKPOINT chooses the debugger; =0 disables them) with
msg, state, ctx, key, offset, record and violation as locals; 'c' continues the replay.
"""


def register(subparsers: Any) -> None:
    """Add the ``replay`` command."""
    parser = add_pipeline_command(
        subparsers,
        "replay",
        help="step through one partition locally, with breakpoints",
        description="Apply the pipeline's processor to one topic-partition in plain Python, "
        "printing each record (offset, key, decoded message) and the state change it made.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--topic", required=True, help="Kafka topic")
    parser.add_argument("--partition", type=int, required=True, help="Kafka partition")
    parser.add_argument("--from-offset", type=int, metavar="A", help="print records from offset A")
    parser.add_argument("--to-offset", type=int, metavar="B", help="stop after offset B")
    parser.add_argument("--key", metavar="K", help="print only records of state key K")
    parser.add_argument(
        "--break-at-offset", type=int, metavar="N", help="stop before applying offset N"
    )
    parser.add_argument(
        "--break-on-violation",
        action="store_true",
        help="stop after a record that breaks an integrity rule",
    )
    parser.add_argument(
        "--break-when",
        metavar="EXPR",
        help="stop before a printed record for which this Python expression is true "
        "(names: msg, state, ctx, key, offset)",
    )
    parser.add_argument(
        "--from-checkpoint-version",
        metavar="V",
        help="start from the checkpointed state after batch V ('auto': the newest one before "
        "--from-offset) instead of replaying from the start of the partition",
    )
    add_run_set_option(parser)
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the replay; exit 1 when it stopped on a fail-policy violation."""
    from inorder.ops.replay import Replayer, ReplayOptions

    version: int | str | None = args.from_checkpoint_version
    if isinstance(version, str) and version != "auto":
        try:
            version = int(version)
        except ValueError:
            raise ConfigError(
                f"--from-checkpoint-version: expected a batch id or 'auto', not {version!r}"
            ) from None
    options = ReplayOptions(
        topic=args.topic,
        partition=args.partition,
        from_offset=args.from_offset,
        to_offset=args.to_offset,
        key=args.key,
        break_at_offset=args.break_at_offset,
        break_on_violation=args.break_on_violation,
        break_when=args.break_when,
        from_version=version,
    )
    target = open_target(args)
    summary = Replayer(target, options).run()
    return 1 if summary.failed is not None else 0
