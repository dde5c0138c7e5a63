"""``inorder inspect PIPELINE``: batches, offsets and state held in a pipeline's checkpoint."""

from __future__ import annotations

import argparse
import json
from typing import Any

from inorder.commands.overrides import add_set_option, parse_overrides, print_notes
from inorder.errors import ConfigError

EXAMPLES = """examples:
  inorder inspect pipeline.toml                       last 20 batches and state sizes
  inorder inspect pipeline.toml --batches --limit 0   every batch still in the log
  inorder inspect pipeline.toml --state --json
  inorder inspect pipeline.toml --key session-17 --topic site-a --partition 0 --version 41
"""


def register(subparsers: Any) -> None:
    """Add the ``inspect`` command."""
    parser = subparsers.add_parser(
        "inspect",
        help="show checkpointed batches, offsets and state",
        description="Read a pipeline's checkpoint (never writing it): batches with their "
        "offset ranges and timings, state size per partition, or one key's state.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("pipeline", help="pipeline TOML file, or module:attribute of a Pipeline")
    parser.add_argument("--batches", action="store_true", help="show batches")
    parser.add_argument("--state", action="store_true", help="show state size per partition")
    parser.add_argument("--limit", type=int, default=20, help="newest N batches (0: all)")
    parser.add_argument("--key", help="show the state of this key (needs --topic, --partition)")
    parser.add_argument("--topic", help="topic of --key")
    parser.add_argument("--partition", type=int, help="partition of --key")
    parser.add_argument(
        "--version", type=int, help="batch version of --key (default: newest committed)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_set_option(parser, "override a setting as `inorder run --set` did")
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Print what was asked."""
    from inorder.ops.batchlog import load_batch_log
    from inorder.ops.inspect import format_inspect, inspect_all, key_state
    from inorder.ops.target import OpsTarget
    from inorder.records import TopicPartition

    target = OpsTarget.load(args.pipeline, parse_overrides(args.set))
    print_notes(target.notes)
    if args.key is not None:
        if args.topic is None or args.partition is None:
            raise ConfigError("--key needs --topic and --partition")
        log = load_batch_log(target.spark_dir, target.engine)
        doc = key_state(
            target, TopicPartition(args.topic, args.partition), args.key, args.version, log
        )
        if args.json:
            print(json.dumps(doc, indent=2, sort_keys=True, default=str))
        elif not doc["exists"]:
            print(
                f"{args.topic}[{args.partition}] key {args.key!r}: no state at version "
                f"{doc['version']}"
            )
        else:
            print(json.dumps(doc, indent=2, default=str))
        return 0
    both = not args.batches and not args.state
    doc = inspect_all(target, args.batches or both, args.state or both, args.limit or None)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print("\n".join(format_inspect(doc)))
    return 0
