"""The ``[codec]`` settings of a pipeline file turned into a schema-registry codec."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from inorder.codecs.avro import AvroCodec
from inorder.codecs.base import Codec
from inorder.codecs.json_schema import JsonSchemaCodec
from inorder.codecs.protobuf import ProtobufCodec
from inorder.codecs.registry_client import SchemaRegistry
from inorder.errors import ConfigError

#: ``codec.type`` values built here.
REGISTRY_KINDS = ("avro", "protobuf", "json_schema")

#: Options that only one codec type understands.
_ONLY = {
    "reader_schema": "avro",
    "schema_file": "avro",
    "message_type": "protobuf",
    "descriptor_set": "protobuf",
    "message_name": "protobuf",
}


def _registry(options: Mapping[str, Any], needed: bool) -> SchemaRegistry | None:
    if not options.get("registry_url") and not needed:
        return None
    return SchemaRegistry(
        options.get("registry_url", ""),
        user_info_env=options.get("registry_user_info_env", ""),
        bearer_token_env=options.get("registry_bearer_token_env", ""),
        bearer_logical_cluster=options.get("registry_bearer_logical_cluster", ""),
        max_retries=options.get("registry_max_retries", 3),
        retries_wait_ms=options.get("registry_retry_wait_ms", 1000),
        timeout_s=float(options.get("registry_timeout", 10.0)),
    )


def _message_class(reference: str) -> Any:
    module, _, name = reference.partition(":")
    if not module or not name:
        raise ConfigError(f"codec.message_type {reference!r} must be 'module:Class'")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"codec.message_type {reference!r}: {exc}") from None


def registry_codec(
    kind: str, options: Mapping[str, Any], msg_type: Any, via: Codec[Any] | None
) -> Codec[Any]:
    """The ``kind`` codec (``avro``, ``protobuf``, ``json_schema``) the options describe.

    ``via``: the processor's own JSON codec, which then receives every record as JSON.
    """
    for option, owner in _ONLY.items():
        if options.get(option) and kind != owner:
            raise ConfigError(f"codec.{option} applies to codec.type = {owner!r}, not {kind!r}")
    if options.get("validate") is False and kind != "json_schema":
        raise ConfigError(f"codec.validate applies to codec.type = 'json_schema', not {kind!r}")
    subject = {
        "subject_name_strategy": options.get("subject_name_strategy", ""),
        "subject_topic": options.get("subject_topic", ""),
        "use_latest_version": options.get("use_latest_version", False),
    }
    strict = options.get("strict", True)
    if kind == "avro":
        schema_file = options.get("schema_file") or None
        return AvroCodec(
            msg_type,
            registry=_registry(options, needed=schema_file is None),
            reader_schema=options.get("reader_schema") or None,
            schema_file=schema_file,
            strict=strict,
            via=via,
            **subject,
        )
    if kind == "protobuf":
        reference = options.get("message_type", "")
        descriptor_set = options.get("descriptor_set") or None
        return ProtobufCodec(
            msg_type,
            message=_message_class(reference) if reference else None,
            descriptor_set=descriptor_set,
            message_name=options.get("message_name", ""),
            registry=_registry(options, needed=False),
            strict=strict,
            via=via,
            **subject,
        )
    if kind == "json_schema":
        return JsonSchemaCodec(
            msg_type,
            registry=_registry(options, needed=True),
            validate=options.get("validate", True),
            strict=strict,
            via=via,
            **subject,
        )
    raise ConfigError(f"codec.type {kind!r} is not one of {', '.join(REGISTRY_KINDS)}")
