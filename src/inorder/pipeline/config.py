"""Pipeline files (TOML) parsed and validated into settings before anything runs.

Building a pipeline from the settings is :mod:`inorder.assemble`'s job. Every problem is
reported as one :class:`~inorder.errors.ConfigError` line naming the section and key (with a
did-you-mean for unknown keys), before Spark or Kafka are touched.
"""

from __future__ import annotations

import copy
import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inorder.durations import parse_duration
from inorder.errors import ConfigError
from inorder.integrity import POLICIES
from inorder.pipeline.config_outputs import check_outputs
from inorder.pipeline.settings import SECTIONS

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
    if pipeline["state_deltas"] not in ("partition", "task"):
        raise ConfigError(
            f"{origin}: pipeline.state_deltas must be 'partition' or 'task', "
            f"not {pipeline['state_deltas']!r}"
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
