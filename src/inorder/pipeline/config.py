"""Pipeline files (TOML) and ``module:attribute`` references, validated before anything runs.

Every problem is reported as one :class:`~inorder.errors.ConfigError` line naming the section
and key (with a did-you-mean for unknown keys), before Spark or Kafka are touched.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inorder.durations import parse_duration
from inorder.errors import ConfigError
from inorder.integrity import POLICIES, REJECT_LIMIT, Integrity
from inorder.pipeline.config_outputs import check_outputs
from inorder.pipeline.settings import SECTIONS
from inorder.processor import Processor
from inorder.references import import_reference

Config = dict[str, dict[str, Any]]

TIERS = ("strict", "fuzzy", "none")
TRIGGER_WORDS = ("available-now", "once")
PROGRESS_MODES = ("auto", "rich", "plain", "json", "quiet")


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def load_toml(path: str | Path) -> Config:
    """Read a pipeline TOML file; syntax errors name the file and line."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"pipeline file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return validate(data, origin=str(path))


def validate(data: Mapping[str, Any], origin: str = "pipeline") -> Config:
    """Check sections, keys and types; fill defaults; return the resolved configuration."""
    resolved: Config = {}
    for section in data:
        if section not in SECTIONS:
            raise ConfigError(
                f"{origin}: unknown section [{section}]{_did_you_mean(section, list(SECTIONS))}"
            )
    for section, settings in SECTIONS.items():
        given = data.get(section, {})
        if not isinstance(given, Mapping):
            raise ConfigError(f"{origin}: [{section}] must be a table")
        values: dict[str, Any] = {}
        for key, value in given.items():
            if key not in settings:
                raise ConfigError(
                    f"{origin}: unknown key {section}.{key}{_did_you_mean(key, list(settings))}"
                )
            setting = settings[key]
            if isinstance(value, bool) and setting.type is not bool:
                ok = False
            else:
                ok = isinstance(value, setting.type)
            if not ok:
                raise ConfigError(
                    f"{origin}: {section}.{key} must be {_article(setting.type_name)}, "
                    f"not {type(value).__name__} {value!r}"
                )
            values[key] = value
        for key, setting in settings.items():
            if key not in values:
                if setting.required and (section in data or section == "processor"):
                    raise ConfigError(f"{origin}: missing required setting {section}.{key}")
                values[key] = copy.deepcopy(setting.default)
        resolved[section] = values
    if not resolved["sink"]["path"]:
        raise ConfigError(f"{origin}: missing required setting sink.path")
    _check_values(resolved, origin)
    return resolved


def _check_values(config: Config, origin: str) -> None:
    pipeline, source, integrity = config["pipeline"], config["source"], config["integrity"]
    trigger = pipeline["trigger"].strip().lower()
    if trigger not in TRIGGER_WORDS:
        try:
            parse_duration(trigger)
        except ValueError as exc:
            raise ConfigError(
                f"{origin}: pipeline.trigger: {exc}; or 'available-now' / 'once'"
            ) from None
    for section, key in (
        ("pipeline", "tick_interval"),
        ("source", "topic_discovery_interval"),
        ("source", "target_batch_duration"),
        ("integrity", "lateness"),
        ("notify", "stall_after"),
        ("pipeline", "lease_duration"),
    ):
        text = config[section][key]
        if text and text != "off":
            try:
                parse_duration(text)
            except ValueError as exc:
                raise ConfigError(f"{origin}: {section}.{key}: {exc}") from None
    if pipeline["backend"] not in ("partition", "spark"):
        raise ConfigError(
            f"{origin}: pipeline.backend must be 'partition' or 'spark', "
            f"not {pipeline['backend']!r}"
        )
    if pipeline["progress"] not in PROGRESS_MODES:
        raise ConfigError(f"{origin}: pipeline.progress must be one of {', '.join(PROGRESS_MODES)}")
    if bool(source["topic_pattern"]) == bool(source["topics"]):
        raise ConfigError(f"{origin}: set exactly one of source.topic_pattern and source.topics")
    if source["max_offsets_per_trigger"] < 0:
        raise ConfigError(f"{origin}: source.max_offsets_per_trigger must be >= 0")
    if integrity["tier"] and integrity["tier"] not in TIERS:
        raise ConfigError(
            f"{origin}: integrity.tier must be one of {', '.join(TIERS)}"
            f"{_did_you_mean(integrity['tier'], list(TIERS))}"
        )
    if integrity["on_violation"] and integrity["on_violation"] not in POLICIES:
        raise ConfigError(
            f"{origin}: integrity.on_violation must be one of "
            f"{', '.join(POLICIES)}"
            f"{_did_you_mean(integrity['on_violation'], list(POLICIES))}"
        )
    if not 0 < integrity["reject_limit"] <= 1:
        raise ConfigError(f"{origin}: integrity.reject_limit must be above 0 and at most 1")
    check_outputs(config, origin)


def _make_processor(config: Config) -> Processor[Any, Any, Any]:
    spec = config["processor"]
    options = dict(spec["options"])
    if spec["type"] == "sessions":
        from inorder.sessions import SessionTables

        factory: Any = SessionTables
        if "inactivity_timeout" in options and isinstance(options["inactivity_timeout"], str):
            options["inactivity_timeout"] = parse_duration(options["inactivity_timeout"])
    else:
        factory = import_reference(spec["type"], "processor.type")
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


def _make_codec(config: Config, processor: Any) -> Any:
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
    return codec() if isinstance(codec, type) else codec


def _make_integrity(config: Config, processor: Processor[Any, Any, Any]) -> Integrity | None:
    spec = config["integrity"]
    given = {k: spec[k] for k in ("tier", "on_violation", "sequence_field") if spec[k]}
    if float(spec["reject_limit"]) != REJECT_LIMIT:
        given["reject_limit"] = float(spec["reject_limit"])
    if not given:
        return None
    if spec["lateness"]:
        given["lateness"] = parse_duration(spec["lateness"])
    return dataclasses.replace(processor.default_integrity() or Integrity.strict(), **given)


def _make_sink(spec: Mapping[str, Any]) -> Any:
    from inorder.dev.endpoints import output_storage_options

    # An s3:// output in the bucket of `inorder dev up` (or $INORDER_S3_ENDPOINT) finds that
    # store as the source finds the dev broker; anything else is used as given.
    storage = output_storage_options(spec["path"], spec["storage_options"])
    if spec["type"] == "delta":
        from inorder.sinks.delta import DeltaSink

        return DeltaSink(
            spec["path"],
            partition_by=list(spec["partition_by"]),
            storage_options=storage,
            table_properties=spec.get("table_properties") or None,
        )
    if spec["type"] == "iceberg":
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
        )
    from inorder.sinks.parquet import ParquetSink

    return ParquetSink(
        spec["path"],
        partition_by=list(spec["partition_by"]),
        compression=spec["compression"],
        target_file_size=spec["target_file_size"],
        storage_options=storage,
    )


def _make_source(spec: Mapping[str, Any]) -> Any:
    from inorder.kafka.api import KafkaSource

    bootstrap = spec["bootstrap_servers"]
    if not bootstrap:
        from inorder.dev.endpoints import kafka_bootstrap_servers

        bootstrap = kafka_bootstrap_servers()
    return KafkaSource(
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


def build_pipeline(config: Config) -> Any:
    """Turn a validated configuration into a :class:`~inorder.pipeline.pipeline.Pipeline`."""
    from inorder.pipeline.pipeline import Pipeline

    pipeline = config["pipeline"]
    processor = _make_processor(config)
    sink = _make_sink(config["sink"])
    dead_letter = None
    if config["dead_letter"]["path"]:
        dead_letter = _make_sink(
            {**config["sink"], "path": config["dead_letter"]["path"], "partition_by": ["topic"]}
        )
    materialized = None
    spec = config["materialized"]
    if spec["path"]:
        from inorder.sessions.materializer import check_materialization

        materialized = _make_sink(
            {
                **config["sink"],
                "path": spec["path"],
                "type": spec["type"] or config["sink"]["type"],
                "partition_by": list(spec["partition_by"]),
                "storage_options": spec["storage_options"] or config["sink"]["storage_options"],
            }
        )
        check_materialization(processor, materialized, spec["every"])
    tables = _make_tables(config, processor)
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
        source=_make_source(config["source"]),
        processor=processor,
        sink=sink,
        checkpoint=pipeline["checkpoint"].replace("<name>", pipeline["name"]),
        codec=_make_codec(config, processor),
        integrity=_make_integrity(config, processor),
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
    )


def _make_tables(config: Config, processor: Any) -> Any:
    """The [tables] section as a ``TableOutputs`` (``None`` without a table path)."""
    spec = config["tables"]
    if not spec["current"] and not spec["history"]:
        return None
    from inorder.dev.endpoints import output_storage_options
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


def load_pipeline(reference: str, overrides: Mapping[str, Any] | None = None) -> Any:
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
    return target() if callable(target) and not hasattr(target, "run") else target
