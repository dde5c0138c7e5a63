"""``inorder verify PIPELINE``: prove exactly-once from commit metadata and footers, no Kafka."""

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
  inorder verify pipeline.toml
  inorder verify pipeline.toml --sample 20 --json
  inorder verify pipeline.toml --digests

Reads the output's commit metadata and the footers of its live files, never Kafka: the
offset ranges of successive batches tile every partition (no gap, no overlap, none
committed twice) up to the batch the pipeline checkpoint last committed, every committed
file exists with the recorded row count, no file belongs to two batches, and nothing a
reader of the documented layout sees is uncommitted.
--digests also reads every live file and checks its rows against the recorded digest.

Exit status: 0 when the proofs hold, 1 on any problem (one PROBLEM line each, naming the
batch, partition and file). See docs/operations.md (verify vs validate).
"""


def register(subparsers: Any) -> None:
    """Add the ``verify`` command."""
    parser = add_pipeline_command(
        subparsers,
        "verify",
        help="prove exactly-once from commit metadata and file footers (no Kafka)",
        description="Check the proofs every batch commit recorded (offset ranges per "
        "partition, files with row counts and digests) against each other and against the "
        "files themselves, without reading Kafka.",
        epilog=EXAMPLES,
    )
    rows = parser.add_mutually_exclusive_group()
    rows.add_argument(
        "--digests",
        action="store_true",
        help="read every live file and check its rows against the recorded digest",
    )
    rows.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="N",
        help="check the digests of N live files chosen at random (default 0)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_run_set_option(parser)
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the verification; exit 1 on any problem."""
    from inorder.errors import ConfigError
    from inorder.ops.verify import checkpoint_end, verify

    if args.sample < 0:
        raise ConfigError(f"--sample must be >= 0, not {args.sample}")
    target = open_target(args)
    owner = target.layout.owner()
    report = verify(
        target.sink, owner, digests=args.digests, sample=args.sample, end=checkpoint_end(target)
    )
    doc, lines, ok = report.to_json(), report.lines(), report.ok
    dead_letter = target.pipeline.dead_letter
    if dead_letter is not None and _readable(dead_letter):
        # Dead letters are committed with the batch, by the same sink classes: the same
        # proofs of files and rows, but no offset ranges (they are the output's exceptions).
        extra = verify(dead_letter, owner, digests=args.digests, sample=args.sample, ranges=False)
        ok = ok and extra.ok
        doc |= {"ok": ok, "dead_letter": extra.to_json()}
        lines += ["dead letters:", *extra.lines()]
    print_report(args.json, doc, lambda: lines)
    return 0 if ok else 1


def _readable(sink: Any) -> bool:
    """Whether ``sink`` is an output verify can read (Parquet, Delta, Iceberg) that exists."""
    from inorder.errors import InorderError
    from inorder.ops.output import sink_kind

    while hasattr(sink, "inner"):
        sink = sink.inner
    try:
        sink_kind(sink)
    except InorderError:
        return False
    try:
        return sink.last_committed_batch() is not None
    except Exception:  # an output never written (no dead letter yet): nothing to verify
        return False
