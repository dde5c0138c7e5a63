"""``inorder run PIPELINE``: run a pipeline from a TOML file or ``module:attribute``."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from inorder.commands.common import add_pipeline_command
from inorder.commands.overrides import add_set_option, parse_overrides
from inorder.commands.ui import add_ui_options, start_ui
from inorder.errors import ConfigError
from inorder.redaction import is_secret_name

if TYPE_CHECKING:
    from inorder.pipeline.spark import EarlySession

EXAMPLES = """examples:
  inorder run examples/sessions.toml
  inorder run examples/sessions.toml --trigger available-now --progress json
  inorder run examples/sessions.toml --print-config
  inorder run examples/sessions.toml --set sink.path=s3://bucket/out --set spark.master=local[2]
  inorder run examples.typed_processor:pipeline
  inorder run examples/sessions.toml --ui           with the live status page on :8765
"""


def register(subparsers: Any) -> None:
    """Add the ``run`` command."""
    parser = add_pipeline_command(
        subparsers,
        "run",
        help="run a pipeline (TOML file or module:attribute)",
        description="Run a pipeline until stopped (SIGINT/SIGTERM stop it cleanly between "
        "triggers; the next run resumes), or until caught up with --trigger available-now.",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--trigger",
        help="override pipeline.trigger: an interval such as "
        "'30 seconds', 'available-now' or 'once'",
    )
    parser.add_argument("--master", help="override spark.master, e.g. local[2]")
    parser.add_argument(
        "--progress",
        choices=["auto", "rich", "plain", "json", "quiet"],
        help="override pipeline.progress (json: JSON lines on stdout)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="same as --progress quiet")
    add_set_option(parser)
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved configuration and exit"
    )
    parser.add_argument(
        "--stop-after-batches",
        type=int,
        metavar="N",
        help="stop cleanly after N micro-batches (testing, canaries)",
    )
    parser.add_argument(
        "--ui",
        action="store_true",
        help="serve the live status page while the pipeline runs (see `inorder ui`)",
    )
    add_ui_options(parser, prefix="ui-")
    parser.add_argument(
        "--accept-changes",
        action="store_true",
        help="accept a changed pipeline name, processor, subscription or output for this "
        "checkpoint and record it (refused without this flag: see docs/operations.md)",
    )
    parser.set_defaults(func=handle)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides = parse_overrides(args.set)
    if args.trigger:
        overrides["pipeline.trigger"] = args.trigger
    if args.master:
        overrides["spark.master"] = args.master
    if args.quiet:
        overrides["pipeline.progress"] = "quiet"
    elif args.progress:
        overrides["pipeline.progress"] = args.progress
    return overrides


def handle(args: argparse.Namespace) -> int:
    """Validate, then run the pipeline; exit 0 when it ends normally with nothing set aside.

    A run whose integrity policy set data aside (dead-lettered, reset or ignored records)
    exits with ``pipeline.set_aside_exit_code`` (3 by default).
    """
    from inorder.assemble import load_pipeline
    from inorder.pipeline.config import load_toml, validate

    overrides = _overrides(args)
    is_toml = args.pipeline.endswith(".toml")
    if args.print_config:
        if not is_toml:
            raise ConfigError("--print-config works with TOML pipeline files")
        config = load_toml(args.pipeline)
        for dotted, value in overrides.items():
            section, _, key = dotted.partition(".")
            config.setdefault(section, {})[key] = value
        config = validate(config, origin=args.pipeline)
        print(printable_toml(config), end="")
        return 0
    if is_toml:
        config = load_toml(args.pipeline)
        for dotted, value in overrides.items():
            section, _, key = dotted.partition(".")
            if section not in config:
                raise ConfigError(f"--set: unknown section {section!r}")
            config[section][key] = value
        from inorder.assemble import build_pipeline

        config = validate(config, origin=args.pipeline)
        early = _start_session(config)  # first: what follows imports for about a second
        from inorder.pipeline.identity import RecordedSettings

        pipeline = build_pipeline(config)
        settings = RecordedSettings.of(args.pipeline, overrides, config)
    else:
        from inorder.pipeline.identity import RecordedSettings

        early = None
        pipeline = load_pipeline(args.pipeline)
        if overrides:
            for dotted, value in overrides.items():
                attribute = {
                    "pipeline.trigger": "trigger",
                    "spark.master": "spark_master",
                    "pipeline.progress": "progress",
                }.get(dotted)
                if attribute is None:
                    raise ConfigError(f"--set {dotted} needs a TOML pipeline file")
                setattr(pipeline, attribute, value)
        settings = RecordedSettings.of(args.pipeline, overrides)
    server = None
    if args.ui:
        from inorder.ops.target import OpsTarget
        from inorder.pipeline.batch_history import BatchHistory

        # The run records into this one (the runner adds none of its own), so the page also
        # shows the history of an object-store checkpoint, kept in memory.
        target = OpsTarget(pipeline)
        history = BatchHistory(target.layout)
        pipeline.observers = [*pipeline.observers, history]
        server = start_ui(args.pipeline, target, args, "ui-", history)
    _record_crashes(str(pipeline.checkpoint), pipeline.name)
    try:
        summary = pipeline.run(
            stop_after_batches=args.stop_after_batches,
            settings=settings,
            accept_changes=args.accept_changes,
            early_session=early,
        )
    finally:
        if server is not None:
            server.stop()
    # A scheduler must not see a run whose policy set data aside as a clean one.
    return pipeline.set_aside_exit_code if summary.set_aside else 0


#: The run log, open for the life of the process, where :func:`_record_crashes` writes.
_CRASH_LOG: list[Any] = []


def _record_crashes(checkpoint: str, name: str) -> None:
    """Make a native crash of this process (a segfault inside a library) write every thread's
    Python stack into the run's log: the terminal sees only the signal, and without the
    stacks a crash that comes once in many runs cannot be placed."""
    import faulthandler

    from inorder.checkpoint.layout import CheckpointLayout

    path = CheckpointLayout.of(checkpoint).run_log_file(name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        log = open(path, "a")  # noqa: SIM115  (kept open: a crash may come at any moment)
    except OSError:
        return  # the runner names an unwritable checkpoint; no crash record then
    faulthandler.enable(log, all_threads=True)
    _CRASH_LOG.append(log)


def _start_session(config: dict[str, dict[str, Any]]) -> EarlySession | None:
    """Start creating the Spark session now, beside building and checking the pipeline.

    Building the pipeline imports pyarrow, pandas and the sinks' libraries, and the runner's
    checks talk to the broker and read the checkpoint: about a second in which the JVM can
    already be starting (see :class:`~inorder.pipeline.spark.EarlySession`). Nothing is read
    with the session before every check has passed. Local masters only: on a cluster, a run
    refused by a check would have taken executors for nothing.
    """
    if not str(config["spark"]["master"]).startswith("local"):
        return None
    from inorder.checkpoint.layout import CheckpointLayout
    from inorder.pipeline.spark import EarlySession

    name = str(config["pipeline"]["name"])
    layout = CheckpointLayout.of(str(config["pipeline"]["checkpoint"]).replace("<name>", name))
    if layout.local_root is not None:
        try:  # the Spark log goes into it
            os.makedirs(layout.local_root, exist_ok=True)
        except OSError:
            return None  # the runner names the problem; the session starts after its checks
    early = EarlySession(
        master=config["spark"]["master"],
        app_name=name,
        conf={str(k): str(v) for k, v in config["spark"]["conf"].items()},
        log_file=layout.run_log_file(name),
    )
    early.start()
    return early


def dump_toml(config: dict[str, dict[str, Any]]) -> str:
    """Write a resolved configuration as TOML (the subset of types settings use), as is."""
    lines: list[str] = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def printable_toml(config: dict[str, dict[str, Any]]) -> str:
    """The configuration as TOML that runs as is, with every secret left out and named.

    A masked value would not run, so secret entries (by :func:`~inorder.redaction.is_secret_name`)
    are omitted instead: object-store credentials then come from the usual environment
    variables; a comment at the top names each omitted setting.
    """
    omitted: list[str] = []
    kept = {
        section: _without_secrets(values, section, omitted) for section, values in config.items()
    }
    header = [f"# omitted (secret): {name}" for name in omitted]
    if omitted:
        header.append("# supply them from the environment or your secret store to run this file")
    return "\n".join([*header, dump_toml(kept)]) if header else dump_toml(kept)


def _without_secrets(values: dict[str, Any], path: str, omitted: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{path}.{key}"
        if is_secret_name(str(key)) and value not in ("", None, {}, []):
            omitted.append(name)
        elif isinstance(value, dict):
            out[key] = _without_secrets(value, name, omitted)
        else:
            out[key] = value
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }"
    return json.dumps(str(value))
