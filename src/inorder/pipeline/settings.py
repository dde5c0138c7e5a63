"""Every setting a pipeline file may hold: name, type, default and meaning.

This table is the single source of truth for TOML validation (unknown keys, wrong types,
missing required settings), for ``inorder run --print-config`` and for the configuration
reference in ``docs/configuration.md`` (a test checks the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of a pipeline file section."""

    type: type | tuple[type, ...]
    default: Any
    doc: str
    required: bool = False

    @property
    def type_name(self) -> str:
        """Human name of the accepted type(s), for error messages and docs."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        names = {
            str: "string",
            int: "integer",
            float: "number",
            bool: "boolean",
            list: "list",
            dict: "table",
        }
        return " or ".join(names.get(t, t.__name__) for t in types)


NO_DEFAULT = None

SECTIONS: dict[str, dict[str, Setting]] = {
    "pipeline": {
        "name": Setting(str, "inorder", "Name of the job (Spark application name, progress)."),
        "checkpoint": Setting(
            str,
            ".inorder/checkpoints/<name>",
            "Checkpoint directory: Spark offsets/commits and inorder state (local path or "
            "shared filesystem).",
        ),
        "trigger": Setting(
            str,
            "10 seconds",
            'When micro-batches run: an interval ("15 minutes"), "available-now" (process '
            'everything available in bounded batches, then stop) or "once".',
        ),
        "backend": Setting(
            str,
            "partition",
            'Ordered engine backend: "partition" (shuffle-free, each topic-partition in one '
            'task, default) or "spark" (groupBy + transformWithState with Spark\'s RocksDB '
            "state: keys spread over Spark tasks through a shuffle).",
        ),
        "state_deltas": Setting(
            str,
            "task",
            'Where a batch\'s state deltas go: "task" (one file per engine task holding all '
            "its partitions', state format 3: far fewer files at many topic-partitions; "
            'releases before it refuse the checkpoint) or "partition" (a file per '
            "topic-partition, state format 2, which those releases read).",
        ),
        "progress": Setting(
            str,
            "auto",
            'Progress output: "auto" (rich on a terminal), "plain", "json" '
            '(JSON lines on stdout) or "quiet".',
        ),
        "tick_interval": Setting(
            str,
            "",
            "Run a micro-batch at least this often even without new records, so "
            'processing-time timeouts fire (e.g. "30 seconds"; empty: only with data).',
        ),
        "job_version": Setting(
            str,
            "",
            "Version of the job, written to a `job_version` column of every output row "
            "(empty: no such column).",
        ),
        "set_aside_exit_code": Setting(
            int,
            3,
            "Exit code of `inorder run` when the run ended normally but its integrity policy "
            "set data aside (dead-lettered, reset or ignored records); 0 treats that as "
            "success.",
        ),
        "lease_duration": Setting(
            str,
            "30 seconds",
            "How long the running driver's hold on the checkpoint lasts without renewal "
            "(renewed every third of it): a second run is refused while it holds; after a "
            "crash the next run takes over once it expires. Keep it well above a commit's "
            "duration.",
        ),
    },
    "source": {
        "bootstrap_servers": Setting(
            str,
            "",
            "Kafka bootstrap servers (default: INORDER_KAFKA_BOOTSTRAP_SERVERS or the "
            "broker started by `inorder dev up`).",
        ),
        "topic_pattern": Setting(
            str,
            "",
            'Regex of topics to subscribe to (e.g. "site-.*"). A run starts by listing the '
            "topics it matches, with a warning when it matches none.",
        ),
        "topics": Setting(
            list,
            [],
            "Explicit list of topics (instead of topic_pattern); a run refuses to start while "
            "one does not exist.",
        ),
        "starting_offsets": Setting(
            str, "earliest", 'Where a new query starts: "earliest", "latest" or JSON.'
        ),
        "max_offsets_per_trigger": Setting(
            int, 0, "Upper bound of records per micro-batch (0: no bound)."
        ),
        "target_batch_duration": Setting(
            str,
            "20 seconds",
            "Size micro-batches to take about this long while there is a backlog (each is a "
            'commit, a progress line, the most a stop or a crash redoes); "off": a batch takes '
            "everything available. max_offsets_per_trigger stays a hard cap.",
        ),
        "fail_on_data_loss": Setting(
            bool, True, "Fail when records to read are gone (retention, deleted topic)."
        ),
        "include_headers": Setting(bool, False, "Read Kafka record headers."),
        "topic_discovery_interval": Setting(
            str, "30 seconds", "How often the topic pattern is re-evaluated."
        ),
        "kafka": Setting(
            dict, {}, "Extra librdkafka/confluent-kafka settings (SASL/SSL...), passed through."
        ),
        "archive": Setting(
            str,
            "",
            "Path of an `inorder archive` dataset: each partition is read from the archive up "
            "to its end, then from Kafka (replay past Kafka's retention). Empty: Kafka only.",
        ),
    },
    "codec": {
        "type": Setting(
            str,
            "",
            '"json", "raw", "avro", "protobuf", "json_schema" or "module:attribute" of a '
            "Codec; empty: the processor's default (JSON into its message type). See "
            "docs/formats.md.",
        ),
        "registry_url": Setting(
            str,
            "",
            "Schema registry URL(s), comma-separated (avro, protobuf, json_schema; default: "
            "INORDER_SCHEMA_REGISTRY_URL). Empty with schema_file/descriptor_set: no registry.",
        ),
        "registry_user_info_env": Setting(
            str, "", 'Name of the environment variable holding basic auth "user:password".'
        ),
        "registry_bearer_token_env": Setting(
            str, "", "Name of the environment variable holding a static bearer token."
        ),
        "registry_bearer_logical_cluster": Setting(
            str, "", "Logical cluster sent with the bearer token (Confluent Cloud)."
        ),
        "registry_max_retries": Setting(
            int,
            3,
            "Retries of a refused, timed-out or 408/429/5xx registry request; then the batch "
            "fails (records are never skipped for an outage).",
        ),
        "registry_retry_wait_ms": Setting(
            int, 1000, "First wait between registry retries (exponential with jitter)."
        ),
        "registry_timeout": Setting((int, float), 10.0, "Seconds one registry request may take."),
        "subject_name_strategy": Setting(
            str,
            "",
            '"topic", "record" or "topic_record": derive a subject (empty: schemas by id '
            "only, no subject lookups).",
        ),
        "subject_topic": Setting(
            str, "", 'Topic the "topic"/"topic_record" strategies name subjects after.'
        ),
        "use_latest_version": Setting(
            bool,
            False,
            "Read every record with the subject's latest registered schema (needs "
            "subject_name_strategy).",
        ),
        "reader_schema": Setting(
            str, "", "avro: .avsc file of the reader schema (schema evolution by Avro's rules)."
        ),
        "schema_file": Setting(
            str,
            "",
            "avro: .avsc file of the writer schema; no registry, values are plain Avro binary "
            "(no framing).",
        ),
        "message_type": Setting(
            str, "", 'protobuf: "module:Class" of the generated message class.'
        ),
        "descriptor_set": Setting(
            str,
            "",
            "protobuf: compiled descriptor set file (protoc --include_imports "
            "--descriptor_set_out), with message_name.",
        ),
        "message_name": Setting(
            str, "", 'protobuf: full name of the message in descriptor_set ("pkg.Msg").'
        ),
        "validate": Setting(
            bool, True, "json_schema: validate each document against its writer schema."
        ),
        "strict": Setting(
            bool,
            True,
            'Exact types when converting into the message type (false: "1" fits an int).',
        ),
    },
    "processor": {
        "type": Setting(
            str, "", '"sessions" (built-in session tables) or "module:Class".', required=True
        ),
        "options": Setting(dict, {}, "Keyword arguments for the processor's constructor."),
    },
    "integrity": {
        "tier": Setting(str, "", '"strict", "fuzzy" or "none" (default: the processor\'s).'),
        "on_violation": Setting(
            str,
            "",
            '"fail", "restart_session" or "dead_letter" (default: the '
            "processor's; otherwise fail). restart_session needs a processor with "
            "`starts_session` (refused at start otherwise).",
        ),
        "sequence_field": Setting(
            str,
            "",
            "Message field holding the producer sequence; a field of the processor's message "
            "type (checked at start).",
        ),
        "lateness": Setting(str, "0 seconds", "Allowed event-time lateness (fuzzy tier)."),
        "reject_limit": Setting(
            (float, int),
            0.5,
            "Under dead_letter or restart_session, a batch in which more than this share of "
            "the records were rejected (at least 100) stops before it commits, naming the "
            "likely wrong setting (row_key, codec, envelope); 1 turns the check off.",
        ),
    },
    "sink": {
        "type": Setting(str, "parquet", '"parquet", "delta" or "iceberg".'),
        "path": Setting(
            str,
            "",
            "Output location: local path or s3://bucket/prefix (iceberg: the warehouse).",
            required=True,
        ),
        "partition_by": Setting(
            list,
            ["topic"],
            'Output columns to partition files by; parquet: "topic_bucket" is a column the '
            "sink derives from the topic (see topic_buckets).",
        ),
        "topic_buckets": Setting(
            int,
            32,
            'parquet, with partition_by = ["topic_bucket"]: the topics are hashed into this '
            "many buckets (Iceberg's bucket transform of the topic name), one partition each; "
            "fixed for the life of an output.",
        ),
        "compression": Setting(str, "zstd", "Parquet compression codec."),
        "target_file_size": Setting(int, 134217728, "Target size of output files in bytes."),
        "compact": Setting(
            bool,
            False,
            "Merge small files after commits by the level rule, in a driver thread beside "
            "the stream (parquet, delta, iceberg).",
        ),
        "compaction_fanout": Setting(
            int, 9, "this many files of a level merge into one of the next (>= 2)."
        ),
        "compaction_levels": Setting(
            int,
            3,
            "files of this level are final: each row rewritten at most so often.",
        ),
        "compaction_max_merge_bytes": Setting(
            int,
            0,
            "the most input bytes one merge reads (>= target_file_size; 0: the "
            "larger of 512 MiB and target_file_size); a file of half of it or more is final.",
        ),
        "storage_options": Setting(
            dict,
            {},
            "Object store settings (endpoint, region...); credentials are better "
            "given by the usual AWS_* environment variables.",
        ),
        "table": Setting(str, "", 'iceberg: the table, "namespace.name" (required).'),
        "catalog": Setting(
            dict,
            {},
            "iceberg: pyiceberg catalog properties passed through (type, uri, ...; "
            "default: the SQL catalog on catalog_file).",
        ),
        "catalog_file": Setting(
            str,
            "",
            "iceberg: SQLite file of the default SQL catalog (default: "
            "<path>/catalog.db; required when path is on S3).",
        ),
        "table_properties": Setting(
            dict, {}, "delta, iceberg: table properties set when the sink creates the table."
        ),
    },
    "dead_letter": {
        "path": Setting(
            str,
            "",
            "Where records that broke a rule go under the dead_letter policy "
            "(default: <sink path>_dead_letter, beside the output; with an Iceberg sink the "
            "table <namespace>.<name>_dead_letter in its catalog, and no path may be set).",
        ),
    },
    "materialized": {
        "every": Setting(
            int,
            0,
            "Session-table pipelines: write every live session's full table to the "
            "materialized output every N micro-batches (and each session's final table when "
            "it ends). Required with `path`.",
        ),
        "path": Setting(
            str,
            "",
            "Where full session tables go: local path or s3://bucket/prefix (empty: none).",
        ),
        "type": Setting(str, "", '"parquet" or "delta" (default: the [sink] type).'),
        "partition_by": Setting(list, ["topic"], "Output columns to partition files by."),
        "storage_options": Setting(
            dict, {}, "Object store settings (default: the [sink] storage_options)."
        ),
    },
    "tables": {
        "current": Setting(
            str,
            "",
            "Session-table pipelines: table of every session's live rows, one row per "
            "(topic, session, row_id), merged once per micro-batch (empty: none): a Delta "
            'table path, or with format = "iceberg" a "namespace.name". See docs/tables.md.',
        ),
        "history": Setting(
            str,
            "",
            "Table of every version of every row (valid_from/valid_to offsets and "
            "times), for as-of queries (empty: none); named like `current`.",
        ),
        "format": Setting(str, "delta", '"delta" or "iceberg": how the tables are kept.'),
        "warehouse": Setting(
            str,
            "",
            "iceberg: warehouse of the tables, local path or s3://bucket/prefix (default "
            "with an Iceberg sink: the sink's warehouse and catalog).",
        ),
        "catalog": Setting(
            dict,
            {},
            "iceberg: pyiceberg catalog properties passed through (default: the SQL catalog "
            "on catalog_file).",
        ),
        "catalog_file": Setting(
            str,
            "",
            "iceberg: SQLite file of the default SQL catalog (default: <warehouse>/catalog.db).",
        ),
        "end": Setting(
            str,
            "keep",
            'What a session\'s `end` does to its rows in the tables: "keep" (its final '
            'table stays, like the change log) or "drop".',
        ),
        "storage_options": Setting(
            dict, {}, "Object store settings (default: the [sink] storage_options)."
        ),
    },
    "notify": {
        "webhook_url": Setting(str, "", "POST a JSON event here on failure, stall or violations."),
        "command": Setting((str, list), "", "Run this command with the JSON event on stdin."),
        "stall_after": Setting(
            str, "30 minutes", "Notify when no batch finished for this long while lag > 0."
        ),
        "violation_threshold": Setting(
            int, 1, "Notify when a batch has at least this many integrity events."
        ),
        "retries": Setting(int, 5, "Delivery attempts per event (exponential backoff)."),
        "backoff_seconds": Setting(float, 1.0, "First retry delay."),
        "timeout_seconds": Setting(float, 10.0, "Timeout of one delivery attempt."),
        "headers": Setting(dict, {}, "Extra HTTP headers for the webhook (e.g. auth)."),
    },
    "metrics": {
        "port": Setting(
            int, -1, "Serve Prometheus metrics on this port (-1: off; 0: any free port)."
        ),
        "host": Setting(str, "127.0.0.1", "Address the metrics endpoint binds to."),
    },
    "spark": {
        "master": Setting(
            str,
            "local[*]",
            "Spark master: local[*], local-cluster[...], spark://host:port, k8s://...",
        ),
        "conf": Setting(dict, {}, "Spark configuration passed through (string values)."),
    },
}


def reference_markdown() -> str:
    """The settings tables of ``docs/configuration.md``, generated from :data:`SECTIONS`."""
    out: list[str] = []
    for section, settings in SECTIONS.items():
        out.append(f"### [{section}]\n")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        for key, setting in settings.items():
            default = "required" if setting.required else f"`{setting.default!r}`"
            out.append(f"| `{key}` | {setting.type_name} | {default} | {setting.doc} |")
        out.append("")
    return "\n".join(out)
