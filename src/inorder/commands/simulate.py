"""``inorder simulate``: collection sites publishing snapshot/update sessions to Kafka."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from inorder.commands.common import add_command, bootstrap_servers
from inorder.dev.sim_formats import FORMATS
from inorder.errors import ConfigError

EXAMPLES = """examples (one per option):
  inorder simulate --bootstrap-servers 127.0.0.1:9092
                      (default: $INORDER_KAFKA_BOOTSTRAP_SERVERS, else the `inorder dev up` broker)
  inorder simulate --sites 10                  topics site-000 .. site-009
  inorder simulate --topic-prefix plant-       topics plant-000, plant-001, ...
  inorder simulate --partitions 8              create missing topics with 8 partitions
  inorder simulate --sessions-per-site 50      50 concurrent sessions per site, interleaved
  inorder simulate --rows-per-snapshot 100     each session starts with a 100-row snapshot
  inorder simulate --messages 1000000          stop after one million messages
  inorder simulate --duration 2m               stop after two minutes (or '90', '30s', '1 hour')
  inorder simulate --duration 1m --rate 5000   about 5000 messages/s (0 = as fast as possible)
  inorder simulate --mix 2:5:1                 insert:update:delete weights
  inorder simulate --restart-every 1000        a session re-sends a snapshot every 1000 messages
  inorder simulate --end-probability 0.001     a session ends (`end`) after a message with p=0.001
  inorder simulate --late-sites 2              2 more sites whose topics appear mid-run ...
  inorder simulate --late-sites 2 --late-after 0.3    ... after 30% of the messages
  inorder simulate --fault-rate drop=0.01,duplicate=0.005,swap=0.005,malformed=0.001
  inorder simulate --fault-rate drop=0.01 --faulty-sessions 0.5    half the sessions are faulty
  inorder simulate --seed 7                    another deterministic run
  inorder simulate --start-ts now              message ts from the current time (default fixed)
  inorder simulate --ground-truth truth.json   write the ground truth (see docs/simulator.md)
  inorder simulate --format avro               registry-framed Avro (also protobuf, json-schema)
  inorder simulate --format avro --registry-url http://127.0.0.1:8081
                      (default: $INORDER_SCHEMA_REGISTRY_URL, else the `inorder dev up` registry)
  inorder simulate --json                      print the summary as JSON
"""


def register(subparsers: Any) -> None:
    """Add the ``simulate`` command."""
    parser = add_command(
        subparsers,
        "simulate",
        help="collection sites publishing snapshot/update sessions (with faults, ground truth)",
        description="Produce snapshot/update sessions (design §3 message contract) from "
        "simulated collection sites, one topic per site, deterministically for a seed; "
        "optionally inject faults and write the ground truth a consumer must reproduce.",
        epilog=EXAMPLES,
    )
    add = parser.add_argument
    add("--bootstrap-servers", metavar="HOST:PORT", help="Kafka bootstrap servers")
    add("--sites", default="3", metavar="N", help="number of sites (topics) (default 3)")
    add("--topic-prefix", default="site-", metavar="P", help="topic prefix (default site-)")
    add("--partitions", default="4", metavar="P", help="partitions of created topics (default 4)")
    add("--sessions-per-site", default="4", metavar="S", help="sessions per site (default 4)")
    add("--rows-per-snapshot", default="10", metavar="R", help="rows of a first snapshot (10)")
    add("--messages", metavar="N", help="total messages (default 10000 unless --duration)")
    add("--duration", metavar="TIME", help="run time: seconds or e.g. '30s', '2 minutes'")
    add("--rate", default="0", metavar="MSG/S", help="target messages/s, 0 = unlimited (0)")
    add("--mix", default="1:3:1", metavar="I:U:D", help="insert:update:delete weights (1:3:1)")
    add("--restart-every", default="0", metavar="K", help="new snapshot every K messages (0: no)")
    add("--end-probability", default="0", metavar="P", help="per-message chance of `end` (0)")
    add("--late-sites", default="0", metavar="N", help="extra sites appearing mid-run (0)")
    add("--late-after", default="0.5", metavar="F", help="fraction of the run before they do")
    add("--fault-rate", default="", metavar="KIND=P,...", help="per-message fault rates")
    add("--faulty-sessions", default="0.25", metavar="F", help="fraction of sessions with faults")
    add("--seed", default="0", metavar="N", help="random seed (default 0)")
    add("--start-ts", default=None, metavar="TS", help="first message ts (epoch s or 'now')")
    add("--ground-truth", metavar="PATH", help="write the ground-truth JSON file here")
    add(
        "--format",
        default="json",
        choices=FORMATS,
        help="value format: json (default), or registry-framed avro, protobuf, json-schema",
    )
    add("--registry-url", metavar="URL", help="schema registry for --format (see examples)")
    add("--json", action="store_true", help="print the summary as one JSON object")
    parser.set_defaults(func=handle)


def _int(option: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{option} expects an integer, got {text!r}") from None


def _float(option: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{option} expects a number, got {text!r}") from None


def _duration(text: str) -> float:
    from inorder.durations import parse_duration

    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise ConfigError(f"--duration: {exc}") from None


def build_config(args: argparse.Namespace) -> Any:
    """The :class:`~inorder.dev.sim_model.SimulationConfig` the options describe (validated)."""
    from inorder.dev.sim_model import FaultRates, OpMix, SimulationConfig

    duration = None if args.duration is None else _duration(args.duration)
    messages = None if args.messages is None else _int("--messages", args.messages)
    if messages is None and duration is None:
        messages = 10_000
    start_ts = SimulationConfig.start_ts
    if args.start_ts is not None:
        start_ts = time.time() if args.start_ts == "now" else _float("--start-ts", args.start_ts)
    config = SimulationConfig(
        sites=_int("--sites", args.sites),
        topic_prefix=args.topic_prefix,
        partitions=_int("--partitions", args.partitions),
        sessions_per_site=_int("--sessions-per-site", args.sessions_per_site),
        rows_per_snapshot=_int("--rows-per-snapshot", args.rows_per_snapshot),
        messages=messages,
        duration=duration,
        rate=_float("--rate", args.rate),
        mix=OpMix.parse(args.mix),
        restart_every=_int("--restart-every", args.restart_every),
        end_probability=_float("--end-probability", args.end_probability),
        late_sites=_int("--late-sites", args.late_sites),
        late_after=_float("--late-after", args.late_after),
        faults=FaultRates.parse(args.fault_rate),
        faulty_sessions=_float("--faulty-sessions", args.faulty_sessions),
        seed=_int("--seed", args.seed),
        start_ts=start_ts,
        ts_step=(1.0 / float(args.rate)) if _float("--rate", args.rate) > 0 else 0.001,
    )
    config.validate()
    return config


def _progress(records: int, elapsed: float) -> None:
    print(f"\r{records:,} records, {records / elapsed:,.0f}/s", end="", file=sys.stderr)


def _encoder(args: argparse.Namespace) -> Any:
    """The registry-framing encoder ``--format`` asks for (``None`` for JSON)."""
    from inorder.dev.sim_formats import framed_encoder
    from inorder.endpoints import schema_registry_url

    if args.format == "json":
        if args.registry_url:
            raise ConfigError("--registry-url applies to --format avro, protobuf or json-schema")
        return None
    return framed_encoder(args.format, args.registry_url or schema_registry_url())


def handle(args: argparse.Namespace) -> int:
    """Run the simulation and print a summary."""
    from inorder.dev.simulator import simulate

    config = build_config(args)
    servers = bootstrap_servers(args.bootstrap_servers)
    encode = _encoder(args)
    interactive = sys.stderr.isatty() and not args.json
    result = simulate(
        config,
        servers,
        args.ground_truth,
        progress=_progress if interactive else None,
        encode=encode,
    )
    if interactive:
        print(file=sys.stderr)
    summary = {**result.summary(), "format": args.format}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    if result.interrupted:
        print("interrupted: stopped early; everything generated was delivered and recorded")
    print(
        f"produced {summary['records']:,} records ({summary['messages']:,} messages) to "
        f"{len(summary['topics'])} topics in {summary['elapsed_s']:.2f} s: "
        f"{summary['records_per_s']:,.0f} records/s"
        + ("" if args.format == "json" else f", {args.format} framed by the schema registry")
    )
    print(
        f"sessions: {summary['sessions']} ({summary['sessions_ended']} ended, "
        f"{summary['sessions_with_faults']} with faults, "
        f"{summary['sessions_table_unknown']} with unknown final table)"
    )
    if summary["faults"]:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(summary["faults"].items()))
        print(f"faults injected: {kinds}")
    if summary["late_activated_at"] is not None:
        print(f"late sites appeared after {summary['late_activated_at']:,} messages")
    if result.ground_truth_path is not None:
        print(f"ground truth: {result.ground_truth_path}")
    return 0
