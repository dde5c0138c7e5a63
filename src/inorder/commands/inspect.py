"""``inorder inspect PIPELINE``: batches, offsets and state held in a pipeline's checkpoint."""

from __future__ import annotations

import argparse
import json
from typing import Any

from inorder.commands.common import (
    add_pipeline_command,
    add_run_set_option,
    open_target,
    print_report,
)
from inorder.errors import ConfigError

EXAMPLES = """examples:
  inorder inspect pipeline.toml                       last 20 batches and state sizes
  inorder inspect pipeline.toml --batches --limit 0   every batch still in the log
  inorder inspect pipeline.toml --state --json
  inorder inspect pipeline.toml --state --topic site-a   state of one topic's partitions
  inorder inspect pipeline.toml --all                 every offset range, a state line each
  inorder inspect pipeline.toml --key session-17 --topic site-a --partition 0 --version 41

At more than 10 topic-partitions a batch's line counts them and names the ranges with the
most records; at more than 20 the state section is a summary, sized from the checkpoint's
file listing (keys are counted with --all, --topic/--partition or --json, which loads and
prints every partition).
"""


def register(subparsers: Any) -> None:
    """Add the ``inspect`` command."""
    parser = add_pipeline_command(
        subparsers,
        "inspect",
        help="show checkpointed batches, offsets and state",
        description="Read a pipeline's checkpoint (never writing it): batches with their "
        "offset ranges and timings (and an Iceberg output's snapshots with their batch ids and "
        "offset ranges, and the session tables' last batches and offsets), state size per "
        "partition, or one key's state.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--batches", action="store_true", help="show batches")
    parser.add_argument("--state", action="store_true", help="show state size per partition")
    parser.add_argument("--limit", type=int, default=20, help="newest N batches (0: all)")
    parser.add_argument("--key", help="show the state of this key (needs --topic, --partition)")
    parser.add_argument(
        "--topic", help="topic of --key; without --key the state section shows its partitions"
    )
    parser.add_argument(
        "--partition",
        type=int,
        help="partition of --key; without --key the state section shows it (of every topic "
        "unless --topic)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="every offset range of a batch and a state line per partition, however many",
    )
    parser.add_argument(
        "--version", type=int, help="batch version of --key (default: newest committed)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_run_set_option(parser)
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Print what was asked."""
    from inorder.ops.batchlog import load_batch_log
    from inorder.ops.inspect import format_inspect, inspect_all, key_state
    from inorder.records import TopicPartition

    target = open_target(args)
    if args.key is not None:
        if args.topic is None or args.partition is None:
            raise ConfigError("--key needs --topic and --partition")
        log = load_batch_log(target.layout, target.engine)
        doc = key_state(
            target, TopicPartition(args.topic, args.partition), args.key, args.version, log
        )
        print_report(args.json, doc, lambda: _key_lines(args, doc))
        return 0
    both = not args.batches and not args.state

    def only(tp: TopicPartition) -> bool:
        if args.topic is not None and tp.topic != args.topic:
            return False
        return args.partition is None or tp.partition == args.partition

    chosen = args.topic is not None or args.partition is not None
    # JSON stays complete: every partition's state is loaded for it.
    load = True if args.json or args.all or chosen else None
    doc = inspect_all(
        target,
        args.batches or both,
        args.state or both,
        args.limit or None,
        load_state=load,
        only=only if chosen else None,
    )
    print_report(args.json, doc, lambda: format_inspect(doc, args.all))
    return 0


def _key_lines(args: argparse.Namespace, doc: dict[str, Any]) -> list[str]:
    if not doc["exists"]:
        return [
            f"{args.topic}[{args.partition}] key {args.key!r}: no state at version {doc['version']}"
        ]
    return [json.dumps(doc, indent=2, default=str)]
