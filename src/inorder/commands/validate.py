"""``inorder validate PIPELINE``: recompute from Kafka in plain Python, diff against the output."""

from __future__ import annotations

import argparse
import os
from typing import Any

from inorder.commands.common import (
    add_pipeline_command,
    add_run_set_option,
    open_target,
    print_report,
)

EXAMPLES = """examples:
  inorder validate pipeline.toml
  inorder validate pipeline.toml --from-offset 120000 --json
  inorder validate pipeline.toml --from-time 2024-05-01T00:00:00Z --topic site-a

Exit status: 0 when the output matches the recomputation (and the session tables of a
pipeline with [tables] match the change log: checked whole, whatever --topic or --from-*
select; --skip-tables skips it), 1 on any discrepancy. Rows are compared without batch_id.
Processing-time timeouts are reproduced exactly only while the checkpoint holds the batch
history (see docs/operations.md and docs/tables.md).
"""


def register(subparsers: Any) -> None:
    """Add the ``validate`` command."""
    parser = add_pipeline_command(
        subparsers,
        "validate",
        help="recompute from Kafka independently and diff against the output",
        description="Read every topic-partition from Kafka, apply the pipeline's processor in "
        "plain Python (no Spark) with the engine's apply core, and compare with the committed "
        "output per partition: first differing offset, missing, extra and different rows.",
        epilog=EXAMPLES,
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--from-offset", type=int, metavar="N", help="compare rows at offsets >= N only"
    )
    start.add_argument(
        "--from-time",
        metavar="TIME",
        help="compare rows of records at or after TIME (ISO 8601 or epoch seconds)",
    )
    parser.add_argument("--topic", help="only this topic")
    parser.add_argument("--partition", type=int, help="only this partition (with --topic)")
    parser.add_argument(
        "--chunk-records",
        type=int,
        default=50_000,
        metavar="N",
        help="records recomputed and compared at a time (memory bound; default 50000)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--all",
        action="store_true",
        help="a line per partition, however many (past 20 partitions, those that match are "
        "one line of totals by default)",
    )
    parser.add_argument(
        "--skip-tables",
        action="store_true",
        help="do not check the session tables ([tables]) against the change log",
    )
    parser.add_argument(
        "--tables-bucket-rows",
        type=int,
        metavar="N",
        help="change-log and table rows of the session tables compared at a time (memory "
        "bound; default 100000)",
    )
    parser.add_argument(
        "--jobs",
        type=_jobs,
        # One process by default: its memory is the bound docs/operations.md states; two
        # finish sooner on two free cores and hold about twice as much.
        default=1,
        metavar="N",
        help="processes sharing the work: partitions and the session-table check (default 1; "
        "each holds its own chunk or bucket, so memory grows with N)",
    )
    add_run_set_option(parser)
    parser.set_defaults(func=handle)


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return jobs


def handle(args: argparse.Namespace) -> int:
    """Run the validation; exit 1 on any discrepancy, 3 when only the policy set records
    aside (the output matches its recomputation, but holds nothing for them)."""
    # This process is validate's own: Arrow's default allocator (mimalloc) kept what the
    # reader threads had freed, and the resident memory grew partition after partition while
    # Arrow held under 30 MB (see docs/benchmarks.md); the C library's allocator gives it
    # back. Arrow's C++ readers take the pool the variable names when they first allocate
    # (pyarrow.set_memory_pool does not reach them), hence before anything imports pyarrow.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    from inorder.assemble import load_target
    from inorder.commands.overrides import parse_overrides
    from inorder.ops.cliutil import parse_time_ms
    from inorder.ops.validate_pool import Options, validate_all
    from inorder.ops.validate_progress import ProgressLine
    from inorder.pipeline.progress import SET_ASIDE_EXIT_CODE
    from inorder.records import TopicPartition

    target = open_target(args)
    from_time = parse_time_ms(args.from_time, "--from-time") if args.from_time else None

    def only(tp: TopicPartition) -> bool:
        if args.topic is not None and tp.topic != args.topic:
            return False
        return args.partition is None or tp.partition == args.partition

    with_tables = not args.skip_tables and getattr(target.pipeline, "tables", None) is not None
    options = Options(
        args.pipeline,
        parse_overrides(args.set),
        load_target,
        from_offset=args.from_offset,
        from_time_ms=from_time,
        chunk_records=args.chunk_records,
        tables=with_tables,
        owner=target.layout.owner() if with_tables else None,
        bucket_rows=args.tables_bucket_rows,
    )
    # A live line on a terminal only: the report on stdout stays the whole output.
    progress = ProgressLine()
    try:
        report, tables = validate_all(target, options, args.jobs, only=only, progress=progress)
        doc, lines, ok = report.to_json(), report.lines(args.all), report.ok
    finally:
        progress.close()
    if tables is not None:
        ok = ok and tables.ok
        doc |= {"ok": ok, "tables": tables.to_json()}
        lines += tables.lines()
    print_report(args.json, doc, lambda: lines)
    if not ok:
        return 1
    # Records set aside by the policy are their own class: never a silent "all clear".
    return SET_ASIDE_EXIT_CODE if report.set_aside else 0
