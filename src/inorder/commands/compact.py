"""``inorder compact PATH``: merge small output files, then remove obsolete ones safely."""

from __future__ import annotations

import argparse
import json
from typing import Any

from inorder.commands.common import add_command
from inorder.errors import ConfigError
from inorder.sinks.base import SinkError
from inorder.storage import fs as sfs

EXAMPLES = """examples:
  inorder compact /data/stats                            Parquet dataset on local disk
  inorder compact s3://bucket/stats --dry-run            show what would be merged
  inorder compact s3://bucket/stats --target-file-size 256MB
  inorder compact /data/stats --full                     merge every non-final file now
  inorder compact s3://bucket/table --format delta --retention-hours 168
  inorder compact /data/warehouse --format iceberg --table sessions.changes

S3 endpoint and credentials come from the AWS_* environment variables
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION) or --storage-option.
Safe to run while the pipeline writes: readers of committed data never see partial or
duplicated rows.
"""

_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def parse_size(text: str, option: str = "--target-file-size") -> int:
    """``"128MB"`` -> bytes (units B, KB, MB, GB; powers of 1024); errors name ``option``."""
    raw = text.strip().upper().replace(" ", "").removesuffix("IB").removesuffix("I")
    number = raw.rstrip("KMGB")
    unit = raw[len(number) :]
    if unit in ("K", "M", "G"):
        unit += "B"
    try:
        value = float(number)
    except ValueError:
        raise ConfigError(f"{option}: cannot read {text!r} (e.g. 128MB)") from None
    if unit not in _UNITS or value <= 0:
        raise ConfigError(f"{option}: cannot read {text!r} (e.g. 128MB)")
    return int(value * _UNITS[unit])


def _detect_format(path: str, storage_options: dict[str, str] | None) -> str:
    location = sfs.resolve(path, storage_options)
    if sfs.list_files(location, location.join("_delta_log")):
        return "delta"
    return "parquet"


def register(subparsers: Any) -> None:
    """Add the ``compact`` command."""
    parser = add_command(
        subparsers,
        "compact",
        help="merge small files of a Parquet dataset, Delta or Iceberg table",
        description="Merge small files of an inorder Parquet dataset (rewrite and swap under "
        "the commit protocol), a Delta table (optimize + vacuum) or an Iceberg table (one "
        "overwrite snapshot; batch summaries stay the exactly-once record).",
        epilog=EXAMPLES,
    )
    parser.add_argument("path", help="dataset location: local path or s3://bucket/prefix")
    parser.add_argument(
        "--format",
        choices=["auto", "parquet", "delta", "iceberg"],
        default="auto",
        help="dataset format (default: delta if PATH has a _delta_log, else parquet; "
        "iceberg: PATH is the warehouse, with --table)",
    )
    parser.add_argument("--table", help="Iceberg: the table, namespace.name")
    parser.add_argument(
        "--catalog-file",
        help="Iceberg: the SQL catalog's SQLite file (default PATH/catalog.db)",
    )
    parser.add_argument(
        "--target-file-size", default="128MB", help="size of merged files (default 128MB)"
    )
    parser.add_argument("--dry-run", action="store_true", help="only report what would be done")
    parser.add_argument(
        "--fanout",
        type=int,
        default=9,
        help="merge this many files of a level into one of the next (default 9)",
    )
    parser.add_argument(
        "--levels",
        type=int,
        default=3,
        help="files of this level are never merged again (default 3)",
    )
    parser.add_argument(
        "--max-merge-size",
        help="the most input one merge reads (default 512MB, or the target file size if larger)",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="merge every non-final file of each partition now, whatever "
        "its level and age (default: the level rule, as the sink's compact option)",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=3600.0,
        help="Parquet: keep replaced files this long for readers still reading them (default 3600)",
    )
    parser.add_argument(
        "--retention-hours",
        type=int,
        default=168,
        help="Delta: vacuum files obsolete for longer than this (default 168 = 7 days)",
    )
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="S3 setting, e.g. endpoint_url=http://127.0.0.1:8333 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Run the compaction and print its summary."""
    options: dict[str, str] = {}
    for item in args.storage_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--storage-option {key!r}: expected KEY=VALUE")
        options[key] = value
    storage = options or None
    target = parse_size(args.target_file_size)
    try:
        return _run(args, storage, target)
    except OSError as exc:
        secrets = tuple(v for k, v in options.items() if "secret" in k.lower() or "token" in k)
        raise SinkError(f"{args.path}: {sfs.describe_error(exc, secrets)}") from None


def _run(args: argparse.Namespace, storage: dict[str, str] | None, target: int) -> int:
    from inorder.sinks.compaction import compact_parquet
    from inorder.sinks.delta_maintenance import compact_delta

    fmt = args.format if args.format != "auto" else _detect_format(args.path, storage)
    report: Any
    how: dict[str, Any] = {
        "storage_options": storage,
        "target_file_size": target,
        "dry_run": args.dry_run,
        **_level_rule(args, target),
    }
    if fmt == "iceberg" or args.table:
        fmt = "iceberg"
        report = _compact_iceberg(args, storage, target)
    elif fmt == "delta":
        report = compact_delta(args.path, retention_hours=args.retention_hours, **how)
    else:
        report = compact_parquet(args.path, grace_seconds=args.grace_seconds, **how)
    if args.json:
        out = dict(vars(report))
        out["format"] = fmt
        print(json.dumps(out))
    else:
        print(f"{args.path} ({fmt}): {report.summary()}")
    return 0


def _max_merge_bytes(args: argparse.Namespace, target: int) -> int:
    """``--max-merge-size`` in bytes; by default the sink's default, or ``target`` if larger."""
    from inorder.sinks.compaction_levels import DEFAULT_MAX_MERGE_BYTES

    if args.max_merge_size is None:
        return max(DEFAULT_MAX_MERGE_BYTES, target)
    return parse_size(args.max_merge_size, "--max-merge-size")


def _compact_iceberg(args: argparse.Namespace, storage: dict[str, str] | None, target: int) -> Any:
    from inorder.sinks.iceberg import IcebergSink
    from inorder.sinks.iceberg_compaction import compact_iceberg

    if not args.table:
        raise ConfigError("--format iceberg needs --table namespace.name")
    sink = IcebergSink(
        args.table, args.path, catalog_file=args.catalog_file, storage_options=storage
    )
    if sink.load_table() is None:
        raise ConfigError(f"{sink.describe()}: no such table")
    return compact_iceberg(sink, target, dry_run=args.dry_run, **_level_rule(args, target))


def _level_rule(args: argparse.Namespace, target: int) -> dict[str, Any]:
    """The level rule's options, the same for every format."""
    return {
        "fanout": args.fanout,
        "levels": args.levels,
        "full": args.full,
        "max_merge_bytes": _max_merge_bytes(args, target),
    }
