"""Checks of a pipeline file's output sections: sink, materialized tables, session tables."""

from __future__ import annotations

from typing import Any

from inorder.errors import ConfigError

Config = dict[str, dict[str, Any]]


def check_outputs(config: Config, origin: str) -> None:
    """Raise :class:`~inorder.errors.ConfigError` naming the first wrong output setting."""
    if config["sink"]["type"] not in ("parquet", "delta", "iceberg"):
        raise ConfigError(f"{origin}: sink.type must be 'parquet', 'delta' or 'iceberg'")
    if config["sink"]["type"] == "iceberg":
        _check_iceberg_sink(config, origin)
    if config["sink"]["target_file_size"] <= 0:
        raise ConfigError(f"{origin}: sink.target_file_size must be > 0")
    _check_compaction(config["sink"], origin)
    _check_materialized(config, origin)
    _check_tables(config, origin)


def _check_compaction(sink: dict[str, Any], origin: str) -> None:
    if sink["compaction_fanout"] < 2:
        raise ConfigError(f"{origin}: sink.compaction_fanout must be >= 2")
    if sink["compaction_levels"] < 1:
        raise ConfigError(f"{origin}: sink.compaction_levels must be >= 1")
    bound = sink["compaction_max_merge_bytes"]
    if bound and bound < sink["target_file_size"]:
        raise ConfigError(
            f"{origin}: sink.compaction_max_merge_bytes must be >= sink.target_file_size "
            f"({sink['target_file_size']}), not {sink['compaction_max_merge_bytes']}"
        )


def _check_tables(config: Config, origin: str) -> None:
    spec = config["tables"]
    if spec["end"] not in ("keep", "drop"):
        raise ConfigError(f"{origin}: tables.end must be 'keep' or 'drop', not {spec['end']!r}")
    paths = [p.rstrip("/") for p in (spec["current"], spec["history"]) if p]
    kind = config["processor"]["type"]
    # A "module:Class" processor may still be session tables: checked when it is built.
    if paths and kind != "sessions" and ":" not in kind:
        raise ConfigError(
            f"{origin}: [tables] needs the session-table processor (processor.type = 'sessions')"
        )
    if spec["format"] == "iceberg":
        _check_iceberg_tables(config, paths, origin)
        return
    if spec["format"] != "delta":
        raise ConfigError(
            f"{origin}: tables.format must be 'delta' or 'iceberg', not {spec['format']!r}"
        )
    if spec["warehouse"] or spec["catalog"] or spec["catalog_file"]:
        raise ConfigError(
            f"{origin}: tables.warehouse, tables.catalog and tables.catalog_file need "
            "tables.format = 'iceberg'"
        )
    if config["sink"]["path"].rstrip("/") in paths or len(set(paths)) < len(paths):
        raise ConfigError(f"{origin}: tables.current, tables.history and sink.path must differ")


def _check_iceberg_tables(config: Config, names: list[str], origin: str) -> None:
    spec, sink = config["tables"], config["sink"]
    for name in names:
        if name.count(".") < 1 or not all(name.split(".")):
            raise ConfigError(
                f"{origin}: tables: Iceberg table {name!r} must be named 'namespace.name'"
            )
    change_log = [sink["table"]] if sink["type"] == "iceberg" else []
    if len(set(names + change_log)) < len(names) + len(change_log):
        raise ConfigError(f"{origin}: tables.current, tables.history and sink.table must differ")
    shared = sink["type"] == "iceberg" and not spec["warehouse"] and not spec["catalog"]
    if names and not shared and not (spec["warehouse"] or spec["catalog"].get("warehouse")):
        raise ConfigError(
            f"{origin}: tables.warehouse is required: Iceberg tables need a warehouse "
            "(or catalog.warehouse; with an Iceberg sink they share its catalog by default)"
        )


def _check_iceberg_sink(config: Config, origin: str) -> None:
    sink = config["sink"]
    if not sink["table"]:
        raise ConfigError(f"{origin}: sink.table is required with sink.type = 'iceberg'")
    # Other outputs take sink.type by default; a second Iceberg output at another path would
    # still name the same table.
    if config["dead_letter"]["path"]:
        raise ConfigError(
            f"{origin}: dead_letter.path does not apply to an Iceberg sink (dead letters go to "
            f"the table {sink['table']}_dead_letter); remove it"
        )
    if config["materialized"]["path"] and config["materialized"]["type"] in ("", "iceberg"):
        raise ConfigError(
            f"{origin}: materialized.type must be 'parquet' or 'delta' with an Iceberg sink"
        )


def _check_materialized(config: Config, origin: str) -> None:
    spec = config["materialized"]
    if spec["type"] and spec["type"] not in ("parquet", "delta"):
        raise ConfigError(f"{origin}: materialized.type must be 'parquet' or 'delta'")
    if spec["every"] < 0 or (spec["path"] and spec["every"] == 0):
        raise ConfigError(
            f"{origin}: materialized.every must be an integer >= 1 (batches between full "
            "materializations)"
        )
    if spec["every"] and not spec["path"]:
        raise ConfigError(f"{origin}: materialized.every is set but materialized.path is not")
    kind = config["processor"]["type"]
    # A "module:Class" processor may still be session tables: checked when it is built.
    if spec["path"] and kind != "sessions" and ":" not in kind:
        raise ConfigError(
            f"{origin}: [materialized] needs the session-table processor "
            "(processor.type = 'sessions')"
        )
    if spec["path"] and spec["path"].rstrip("/") == config["sink"]["path"].rstrip("/"):
        raise ConfigError(f"{origin}: materialized.path must differ from sink.path")


__all__ = ["check_outputs"]
