"""Assembling a pipeline: settings (a validated TOML configuration) into a ``Pipeline``.

This is the composition root: the one module that may import every part (sinks, sources,
processors, the dev services' endpoints, notifications and metrics), so that the parts import
only what is below them. :mod:`inorder.pipeline.config` parses and checks a TOML file into
settings; :func:`build_pipeline` turns settings into a :class:`~inorder.pipeline.pipeline.Pipeline`;
:func:`load_pipeline` does both for a TOML path or a ``module:attribute`` reference. Sink and
processor types are looked up in small registries (:data:`SINK_TYPES`, :data:`PROCESSOR_TYPES`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inorder.durations import parse_duration
from inorder.errors import ConfigError, SinkError
from inorder.integrity import REJECT_LIMIT, Integrity
from inorder.kafka.api import KafkaSource
from inorder.pipeline.config import Config, load_toml, validate
from inorder.pipeline.pipeline import Pipeline
from inorder.pipeline.settings import SECTIONS
from inorder.processor import Processor
from inorder.references import import_reference
from inorder.sinks.base import Sink

if TYPE_CHECKING:
    from inorder.codecs.base import Codec
    from inorder.ops.target import OpsTarget
    from inorder.sessions.tables_writer import TableOutputs

#: ``processor.type`` names built in, as ``module:attribute`` references (any other value is
#: itself such a reference).
PROCESSOR_TYPES: dict[str, str] = {"sessions": "inorder.sessions:SessionTables"}


def make_processor(config: Config) -> Processor[Any, Any, Any]:
    """The ``[processor]`` section's processor, made with its options."""
    spec = config["processor"]
    options = dict(spec["options"])
    builtin = PROCESSOR_TYPES.get(spec["type"])
    factory: Any = import_reference(builtin or spec["type"], "processor.type")
    if builtin and isinstance(options.get("inactivity_timeout"), str):
        options["inactivity_timeout"] = parse_duration(options["inactivity_timeout"])
    try:
        processor = factory(**options)
    except TypeError as exc:
        raise ConfigError(f"processor.options: {exc}") from None
    if not isinstance(processor, Processor):
        raise ConfigError(
            f"processor.type: {spec['type']!r} made a {type(processor).__name__}, "
            "not a subclass of inorder.Processor"
        )
    return processor


def make_codec(config: Config, processor: Any) -> Codec[Any] | None:
    """The ``[codec]`` section's codec (``None``: the processor's own or JSON)."""
    spec = config["codec"]
    kind = spec["type"]
    from inorder.codecs.registry_config import REGISTRY_KINDS, registry_codec

    if kind in REGISTRY_KINDS:
        from inorder.processor import processor_types

        # A processor with its own (JSON) codec, like the session processor, gets each
        # record re-encoded as JSON through it, so every check of that codec still applies.
        own = processor.default_codec()
        return registry_codec(kind, spec, processor_types(processor).msg, own)
    stray = [k for k, s in SECTIONS["codec"].items() if k != "type" and spec[k] != s.default]
    if stray:
        raise ConfigError(
            f"codec.{stray[0]} applies to codec.type avro, protobuf or json_schema, "
            f"not {kind or 'the default'!r}"
        )
    if not kind:
        return None
    if kind == "raw":
        from inorder.codecs.raw import RawCodec

        return RawCodec()
    if kind == "json":
        from inorder.codecs.json import JsonCodec
        from inorder.processor import processor_types

        return JsonCodec(processor_types(processor).msg)
    codec = import_reference(kind, "codec.type")
    made: Codec[Any] = codec() if isinstance(codec, type) else codec
    return made


def make_integrity(config: Config, processor: Processor[Any, Any, Any]) -> Integrity | None:
    """The ``[integrity]`` settings over the processor's default (``None``: none given)."""
    spec = config["integrity"]
    given = {k: spec[k] for k in ("tier", "on_violation", "sequence_field") if spec[k]}
    if float(spec["reject_limit"]) != REJECT_LIMIT:
        given["reject_limit"] = float(spec["reject_limit"])
    if not given:
        return None
    if spec["lateness"]:
        given["lateness"] = parse_duration(spec["lateness"])
    return dataclasses.replace(processor.default_integrity() or Integrity.strict(), **given)


def _delta_sink(spec: Mapping[str, Any], storage: dict[str, str] | None) -> Sink:
    from inorder.sinks.commit_log import DEFAULT_TARGET_FILE_SIZE
    from inorder.sinks.compaction_levels import DEFAULT_FANOUT, DEFAULT_LEVELS
    from inorder.sinks.delta import DeltaSink

    # A section made by hand (the dead-letter and materialized ones, tests) may hold only
    # path, type, partition_by and storage options: the rest are the settings' defaults.
    return DeltaSink(
        spec["path"],
        partition_by=list(spec["partition_by"]),
        storage_options=storage,
        compression=spec.get("compression", "zstd"),
        target_file_size=spec.get("target_file_size", DEFAULT_TARGET_FILE_SIZE),
        compact=spec.get("compact", False),
        table_properties=spec.get("table_properties") or None,
        compaction_fanout=spec.get("compaction_fanout", DEFAULT_FANOUT),
        compaction_levels=spec.get("compaction_levels", DEFAULT_LEVELS),
        compaction_max_merge_bytes=spec.get("compaction_max_merge_bytes") or None,
    )


def _iceberg_sink(spec: Mapping[str, Any], storage: dict[str, str] | None) -> Sink:
    from inorder.sinks.compaction_levels import (
        DEFAULT_FANOUT,
        DEFAULT_LEVELS,
        DEFAULT_MAX_MERGE_BYTES,
        LevelSettings,
    )
    from inorder.sinks.iceberg import IcebergSink

    return IcebergSink(
        spec["table"],
        spec["path"],
        partition_by=list(spec["partition_by"]),
        catalog=spec["catalog"] or None,
        catalog_file=spec["catalog_file"] or None,
        storage_options=storage,
        compression=spec["compression"],
        target_file_size=spec["target_file_size"],
        table_properties=spec["table_properties"] or None,
        compact=spec.get("compact", False),
        compaction=LevelSettings(
            spec["target_file_size"],
            spec.get("compaction_fanout", DEFAULT_FANOUT),
            spec.get("compaction_levels", DEFAULT_LEVELS),
            None,
            spec.get("compaction_max_merge_bytes")
            or max(DEFAULT_MAX_MERGE_BYTES, spec["target_file_size"]),
        ),
    )


def _parquet_sink(spec: Mapping[str, Any], storage: dict[str, str] | None) -> Sink:
    from inorder.sinks.compaction_levels import (
        DEFAULT_FANOUT,
        DEFAULT_LEVELS,
    )
    from inorder.sinks.parquet import ParquetSink
    from inorder.sinks.topic_bucket import DEFAULT_TOPIC_BUCKETS

    return ParquetSink(
        spec["path"],
        partition_by=list(spec["partition_by"]),
        compression=spec["compression"],
        target_file_size=spec["target_file_size"],
        storage_options=storage,
        compact=spec.get("compact", False),
        compaction_fanout=spec.get("compaction_fanout", DEFAULT_FANOUT),
        compaction_levels=spec.get("compaction_levels", DEFAULT_LEVELS),
        compaction_max_merge_bytes=spec.get("compaction_max_merge_bytes") or None,
        topic_buckets=spec.get("topic_buckets", DEFAULT_TOPIC_BUCKETS),
    )


#: ``sink.type`` -> the factory of that sink from its section and resolved storage options.
SINK_TYPES: dict[str, Callable[[Mapping[str, Any], dict[str, str] | None], Sink]] = {
    "parquet": _parquet_sink,
    "delta": _delta_sink,
    "iceberg": _iceberg_sink,
}


def make_sink(spec: Mapping[str, Any], section: str = "sink") -> Sink:
    """A sink from a ``[sink]``-shaped section (also the dead-letter and materialized ones).

    A setting the sink refuses is a :class:`ConfigError` naming ``section`` (exit code 2, as
    any wrong setting): building a sink only checks its settings, it reads and writes nothing.
    """
    from inorder.endpoints import output_storage_options

    # An s3:// output in the bucket of `inorder dev up` (or $INORDER_S3_ENDPOINT) finds that
    # store as the source finds the dev broker; anything else is used as given.
    storage = output_storage_options(spec["path"], spec["storage_options"])
    factory = SINK_TYPES.get(spec["type"] or "parquet", _parquet_sink)
    try:
        return factory(spec, storage)
    except SinkError as exc:
        raise ConfigError(f"[{section}] {exc}") from None


def make_source(spec: Mapping[str, Any]) -> KafkaSource:
    """The ``[source]`` section's source (no bootstrap servers: the dev broker's).

    With ``archive`` set, a :class:`~inorder.archive.tiered_source.TieredSource`: the archive
    up to its end, then Kafka.
    """
    bootstrap = spec["bootstrap_servers"]
    if not bootstrap:
        from inorder.endpoints import kafka_bootstrap_servers

        bootstrap = kafka_bootstrap_servers()
    source = KafkaSource(
        bootstrap_servers=bootstrap,
        topic_pattern=spec["topic_pattern"] or None,
        topics=list(spec["topics"]) or None,
        starting_offsets=spec["starting_offsets"],
        max_offsets_per_trigger=spec["max_offsets_per_trigger"] or None,
        target_batch_duration=spec.get("target_batch_duration") or "off",
        fail_on_data_loss=spec["fail_on_data_loss"],
        include_headers=spec["include_headers"],
        topic_discovery_interval=spec["topic_discovery_interval"],
        kafka_options=dict(spec["kafka"]),
        archive=spec.get("archive") or None,
    )
    if source.reads_archive:
        from inorder.archive.tiered_source import TieredSource

        return TieredSource.of(source)
    return source


def build_pipeline(config: Config) -> Pipeline[object, object, object]:
    """Turn a validated configuration into a :class:`~inorder.pipeline.pipeline.Pipeline`."""

    pipeline = config["pipeline"]
    processor = make_processor(config)
    sink = make_sink(config["sink"])
    dead_letter = None
    if config["dead_letter"]["path"]:
        dead_letter = make_sink(
            {**config["sink"], "path": config["dead_letter"]["path"], "partition_by": ["topic"]},
            "dead_letter",
        )
    materialized = None
    spec = config["materialized"]
    if spec["path"]:
        from inorder.sessions.materializer import check_materialization

        materialized = make_sink(
            {
                **config["sink"],
                "path": spec["path"],
                "type": spec["type"] or config["sink"]["type"],
                "partition_by": list(spec["partition_by"]),
                "storage_options": spec["storage_options"] or config["sink"]["storage_options"],
            },
            "materialized",
        )
        check_materialization(processor, materialized, spec["every"])
    tables = make_tables(config, processor)
    tick = pipeline["tick_interval"]
    observers: list[Any] = []
    notify = config["notify"]
    if notify["webhook_url"] or notify["command"]:
        from inorder.ops.notify import Notifier, NotifySettings

        observers.append(Notifier(NotifySettings.from_config(notify), pipeline["name"]))
    if config["metrics"]["port"] >= 0:
        from inorder.ops.metrics import MetricsExporter

        observers.append(
            MetricsExporter(config["metrics"]["port"], config["metrics"]["host"], pipeline["name"])
        )
    return Pipeline(
        source=make_source(config["source"]),
        processor=processor,
        sink=sink,
        checkpoint=pipeline["checkpoint"].replace("<name>", pipeline["name"]),
        codec=make_codec(config, processor),
        integrity=make_integrity(config, processor),
        trigger=pipeline["trigger"],
        backend=pipeline["backend"],
        dead_letter=dead_letter,
        name=pipeline["name"],
        spark_master=config["spark"]["master"],
        spark_conf={str(k): str(v) for k, v in config["spark"]["conf"].items()},
        progress=pipeline["progress"],
        tick_interval=parse_duration(tick) if tick else None,
        observers=observers,
        job_version=pipeline.get("job_version") or None,
        materialized=materialized,
        materialize_every=spec["every"] or None,
        tables=tables,
        lease_duration=parse_duration(lease) if (lease := pipeline["lease_duration"]) else None,
        set_aside_exit_code=pipeline["set_aside_exit_code"],
        state_deltas=pipeline["state_deltas"],
    )


def make_tables(config: Config, processor: Any) -> TableOutputs | None:
    """The [tables] section as a ``TableOutputs`` (``None`` without a table path)."""
    spec = config["tables"]
    if not spec["current"] and not spec["history"]:
        return None
    from inorder.endpoints import output_storage_options
    from inorder.sessions.tables_writer import TableOutputs, check_tables

    given = spec["storage_options"] or config["sink"]["storage_options"]
    first = spec["current"] or spec["history"]
    iceberg: dict[str, Any] = {}
    if spec["format"] == "iceberg":
        sink = config["sink"]
        if sink["type"] == "iceberg" and not spec["warehouse"] and not spec["catalog"]:
            # The tables go to the change log's catalog.
            spec = {**spec, "warehouse": sink["path"], "catalog": sink["catalog"]}
            spec["catalog_file"] = spec["catalog_file"] or sink["catalog_file"]
        first = spec["warehouse"] or spec["catalog"].get("warehouse", "")
        iceberg = {
            "format": "iceberg",
            "warehouse": spec["warehouse"] or None,
            "catalog": spec["catalog"] or None,
            "catalog_file": spec["catalog_file"] or None,
        }
    tables = TableOutputs(
        current=spec["current"] or None,
        history=spec["history"] or None,
        end=spec["end"],
        storage_options=output_storage_options(first, given),
        **iceberg,
    )
    check_tables(processor, tables)
    return tables


def load_pipeline(
    reference: str, overrides: Mapping[str, object] | None = None
) -> Pipeline[object, object, object]:
    """A pipeline from a TOML file path or a ``module:attribute`` (a Pipeline or a factory)."""
    if reference.endswith(".toml") or Path(reference).is_file():
        config = load_toml(reference)
        if overrides:
            for dotted, value in overrides.items():
                section, _, key = dotted.partition(".")
                if section not in config:
                    raise ConfigError(f"--set: unknown section {section!r}")
                config[section][key] = value
            config = validate(config, origin=reference)
        return build_pipeline(config)
    target = import_reference(reference, "pipeline")
    made = target() if callable(target) and not hasattr(target, "run") else target
    if not isinstance(made, Pipeline):
        raise ConfigError(
            f"pipeline {reference!r} is a {type(made).__name__}, not an inorder.Pipeline "
            "(or a function returning one)"
        )
    return made


def load_target(reference: str, overrides: Mapping[str, object] | None = None) -> OpsTarget:
    """The operations tools' view of a pipeline (TOML file or ``module:attribute``), loaded
    as its last run ran it.

    A TOML pipeline gets the ``--set`` overrides its last run recorded in the checkpoint
    (``overrides`` given here win), so the tools judge the output that run wrote.
    """
    from inorder.ops.target import OpsTarget
    from inorder.pipeline.identity import RecordedSettings

    given = dict(overrides or {})
    pipeline = load_pipeline(reference, given)
    if not reference.endswith(".toml"):
        return OpsTarget(pipeline)
    info = pipeline.checkpoint_layout().info()
    recorded = RecordedSettings.from_json(None if info is None else info.settings)
    if recorded is None:
        return OpsTarget(pipeline)
    replay = {**recorded.replayable_overrides(), **given}
    notes = []
    if replay != given:
        pipeline = load_pipeline(reference, replay)
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(replay.items()) if k not in given)
        notes.append(
            f"using the overrides the last run ({recorded.recorded_at}) recorded in the "
            f"checkpoint: {shown}"
        )
    masked = sorted(k for k, v in recorded.overrides.items() if k not in replay)
    if masked:
        notes.append(
            f"the last run overrode {', '.join(masked)} with a secret that is not recorded: "
            "using the file's value (pass it again with --set if it differs)"
        )
    if recorded.source and recorded.source not in ("python", reference):
        notes.append(f"the last run used {recorded.source}, not {reference}")
    return OpsTarget(pipeline, notes)
