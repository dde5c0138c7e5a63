"""``inorder repair PIPELINE``: roll output and checkpoint back to the last clean session starts."""

from __future__ import annotations

import argparse
from typing import Any

from inorder.commands.common import (
    add_pipeline_command,
    add_run_set_option,
    open_target,
    print_report,
)

EXAMPLES = """examples:
  inorder repair pipeline.toml                          print the plan (changes nothing)
  inorder repair pipeline.toml --apply                  perform it
  inorder repair pipeline.toml --validate --apply       fail where the output first differs
  inorder repair pipeline.toml --at-offset site-a:0:120000 --apply
  inorder repair pipeline.toml --at-time 2024-05-01T10:00:00Z --json
  inorder repair pipeline.toml --session s-17 --apply

Stop the pipeline first. Per partition the restart offset is the latest one no session
straddles, at or before the failure point (default: the end of the last committed batch).
Output rows from there on are deleted, the checkpoint is moved to <checkpoint>.bak-<time>,
and a fresh checkpoint makes the next `inorder run` start there. See docs/operations.md.
"""


def register(subparsers: Any) -> None:
    """Add the ``repair`` command."""
    parser = add_pipeline_command(
        subparsers,
        "repair",
        help="roll output and checkpoint back to the last snapshots",
        description="Find, per partition, the latest offset at or before the failure point "
        "where every live session starts afresh (a snapshot), delete the output rows from "
        "there on, back up the checkpoint and write a new one that resumes from there. "
        "Prints the plan unless --apply is given.",
        epilog=EXAMPLES,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--at-offset",
        action="append",
        default=[],
        metavar="TOPIC:PARTITION:OFFSET",
        help="failure point of one partition (repeatable); other partitions use the default",
    )
    where.add_argument(
        "--at-time",
        metavar="TIME",
        help="failure point: the first record at or after TIME (ISO 8601 or epoch seconds)",
    )
    where.add_argument(
        "--session",
        metavar="S",
        help="also reprocess session S from its latest start before the failure point",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="first run `inorder validate`: partitions whose output differs fail at their "
        "first differing offset",
    )
    parser.add_argument("--apply", action="store_true", help="perform the plan")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--all",
        action="store_true",
        help="a line per partition, however many (past 20 partitions the plan is a line "
        "per reason of failure point by default)",
    )
    add_run_set_option(parser)
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Plan, and with ``--apply`` perform, the repair."""
    from inorder.errors import ConfigError
    from inorder.ops.cliutil import parse_time_ms
    from inorder.ops.repair import apply_repair, parse_at_offset, plan_repair

    at_offsets = {}
    for text in args.at_offset:
        tp, offset = parse_at_offset(text)
        if tp in at_offsets:
            raise ConfigError(f"--at-offset: {tp} given twice")
        at_offsets[tp] = offset
    at_time = parse_time_ms(args.at_time, "--at-time") if args.at_time else None
    target = open_target(args)
    plan = plan_repair(target, at_offsets or None, at_time, args.session, args.validate)
    if args.apply:
        plan = apply_repair(target, plan)
    print_report(args.json, plan.to_json(), lambda: plan.lines(args.all))
    return 0
