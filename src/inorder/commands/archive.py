"""``inorder archive run|status``: the raw Kafka archive (see docs/archive.md)."""

from __future__ import annotations

import argparse
import json
import tomllib
from typing import Any

from inorder.commands.common import add_command, bootstrap_servers
from inorder.errors import ConfigError

EXAMPLES = """examples:
  inorder archive run archive.toml
  inorder archive run --bootstrap-servers localhost:9092 --topic-pattern 'site-.*' \\
      --path s3://bucket/raw --checkpoint /var/lib/inorder/raw --trigger available-now
  inorder archive status s3://bucket/raw --json

archive.toml:
  [archive]
  path = "s3://bucket/raw"              # where records land (Parquet, zstd)
  checkpoint = "/var/lib/inorder/raw"   # Spark offsets of the archiver
  trigger = "1 minute"                  # or "available-now"
  target_file_size = 536870912          # bytes
  [source]                              # the keys of a pipeline's [source]
  topic_pattern = "site-.*"
  [spark]
  master = "local[*]"

Pipelines read through an archive with `archive = "s3://bucket/raw"` in their [source].
S3 settings come from the AWS_* environment variables.
"""

_ARCHIVE_KEYS: dict[str, type | tuple[type, ...]] = {
    "path": str,
    "checkpoint": str,
    "trigger": str,
    "target_file_size": int,
    "compression": str,
    "name": str,
}


def _archive_from_config(data: dict[str, Any], origin: str) -> Any:
    from inorder.assemble import make_source
    from inorder.checkpoint.layout import CheckpointLayout
    from inorder.pipeline.archiver import Archive
    from inorder.pipeline.settings import SECTIONS

    for section in data:
        if section not in ("archive", "source", "spark"):
            raise ConfigError(f"{origin}: unknown section [{section}] (archive, source, spark)")
    spec = dict(data.get("archive", {}))
    for key, value in spec.items():
        if key not in _ARCHIVE_KEYS:
            raise ConfigError(f"{origin}: unknown key archive.{key}")
        if not isinstance(value, _ARCHIVE_KEYS[key]) or isinstance(value, bool):
            raise ConfigError(f"{origin}: archive.{key} has the wrong type ({value!r})")
    for key in ("path", "checkpoint"):
        if not spec.get(key):
            raise ConfigError(f"{origin}: missing required setting archive.{key}")
    resolved: dict[str, dict[str, Any]] = {}
    for section in ("source", "spark"):
        given = dict(data.get(section, {}))
        values: dict[str, Any] = {}
        for key, setting in SECTIONS[section].items():
            values[key] = given.pop(key, setting.default)
        if given:
            raise ConfigError(f"{origin}: unknown key {section}.{next(iter(given))}")
        resolved[section] = values
    if resolved["source"]["archive"]:
        raise ConfigError(f"{origin}: source.archive: an archive reads Kafka, not an archive")
    if bool(resolved["source"]["topic_pattern"]) == bool(resolved["source"]["topics"]):
        raise ConfigError(f"{origin}: set exactly one of source.topic_pattern and source.topics")
    return Archive(
        source=make_source(resolved["source"]),
        path=spec["path"],
        checkpoint=CheckpointLayout.of(spec["checkpoint"]),
        trigger=spec.get("trigger", "1 minute"),
        compression=spec.get("compression", "zstd"),
        target_file_size=spec.get("target_file_size", 512 * 1024 * 1024),
        name=spec.get("name", "inorder-archive"),
        spark_master=resolved["spark"]["master"],
        spark_conf={str(k): str(v) for k, v in resolved["spark"]["conf"].items()},
    )


def _run(args: argparse.Namespace) -> int:
    from inorder.kafka.api import KafkaSource

    if args.config:
        try:
            with open(args.config, "rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"archive file {args.config!r} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{args.config}: invalid TOML: {exc}") from None
        archive = _archive_from_config(data, args.config)
        if args.trigger:
            archive.trigger = args.trigger
    else:
        if not args.path or not args.checkpoint:
            raise ConfigError("archive run: give ARCHIVE.toml, or --path and --checkpoint")
        if bool(args.topic_pattern) == bool(args.topic):
            raise ConfigError("archive run: give exactly one of --topic-pattern and --topic")
        bootstrap = bootstrap_servers(args.bootstrap_servers)
        from inorder.checkpoint.layout import CheckpointLayout
        from inorder.pipeline.archiver import Archive

        archive = Archive(
            source=KafkaSource(
                bootstrap,
                topic_pattern=args.topic_pattern,
                topics=args.topic or None,
                max_offsets_per_trigger=args.max_offsets_per_trigger,
            ),
            path=args.path,
            checkpoint=CheckpointLayout.of(args.checkpoint),
            trigger=args.trigger or "1 minute",
            spark_master=args.master,
        )

    def report(r: Any) -> None:
        if not args.quiet:
            print(
                f"batch {r.batch_id}: {r.records} records, {r.files} files, "
                f"{r.bytes / 1e6:.1f} MB, {r.seconds:.1f} s"
                + ("" if r.committed else " (already committed)"),
                flush=True,
            )

    archive.on_batch = report
    summary = archive.run()
    print(
        f"archive {archive.path}: {summary.batches} batches, {summary.records} records, "
        f"{summary.files} files, {summary.bytes / 1e6:.1f} MB in {summary.seconds:.1f} s"
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    from inorder.archive.coverage import load_coverage
    from inorder.storage import fs as sfs

    location = sfs.resolve(args.path)
    if not sfs.list_files(location, location.join("_inorder", "commits")):
        raise ConfigError(f"{args.path}: no archive here (no committed batch)")
    coverage = load_coverage(args.path)
    rows = []
    for tp in sorted(coverage.partitions):
        cov = coverage.of(tp)
        if cov is None:
            continue
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "start": cov.start,
                "end": cov.end,
                "records": sum(s.records for s in cov.segments),
                "files": sum(len(s.files) for s in cov.segments),
            }
        )
    if args.json:
        print(json.dumps({"path": args.path, "batches": coverage.batches, "partitions": rows}))
        return 0
    print(f"archive {args.path}: {coverage.batches} committed batches")
    for r in rows:
        print(
            f"  {r['topic']}[{r['partition']}]  offsets {r['start']}..{r['end']}  "
            f"{r['records']} records in {r['files']} files"
        )
    return 0


def register(subparsers: Any) -> None:
    """Add the ``archive`` command."""
    parser = add_command(
        subparsers,
        "archive",
        help="land every Kafka record in a Parquet archive; show what it holds",
        description="The raw archive: every consumed Kafka record exactly once, in a Parquet "
        "dataset partitioned by topic and date. Pipelines and `inorder replay`/`validate` "
        "read through it past Kafka's retention.",
        epilog=EXAMPLES,
    )
    sub = parser.add_subparsers(dest="archive_command", required=True)
    run = add_command(sub, "run", help="run the archiver", epilog=EXAMPLES)
    run.add_argument("config", nargs="?", help="archive TOML file")
    run.add_argument("--bootstrap-servers", default="")
    run.add_argument("--topic-pattern", default=None)
    run.add_argument("--topic", action="append", default=[], help="topic (repeatable)")
    run.add_argument("--path", default="", help="archive location (local or s3://)")
    run.add_argument("--checkpoint", default="", help="the archiver's checkpoint directory")
    run.add_argument("--trigger", default="", help='interval, "available-now" or "once"')
    run.add_argument("--max-offsets-per-trigger", type=int, default=None)
    run.add_argument("--master", default="local[*]", help="Spark master")
    run.add_argument("--quiet", action="store_true", help="no per-batch lines")
    run.set_defaults(func=_run)
    status = add_command(sub, "status", help="committed offsets per topic-partition")
    status.add_argument("path", help="archive location")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=_status)
