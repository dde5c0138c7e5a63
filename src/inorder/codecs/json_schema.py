"""JSON Schema Kafka values, Schema Registry framed (confluent-kafka's ``JSONDeserializer``).

Each value is the magic byte, a 4-byte schema id, then UTF-8 JSON. The writer's JSON Schema
is fetched by id (once per worker process) and, with ``validate`` (the default), the document
is validated against it before it becomes the processor's message; a document that does not
validate is a :class:`~inorder.codecs.registry_errors.MalformedPayloadError`.
"""

from __future__ import annotations

from typing import Any

from inorder.codecs.base import Codec
from inorder.codecs.registry_base import Msg, RegistryCodec, as_registry
from inorder.codecs.registry_client import SchemaRegistry, registry_client
from inorder.codecs.registry_fast import Deserialize, Prepare
from inorder.errors import ConfigError


class JsonSchemaCodec(RegistryCodec[Msg]):
    """Decodes framed JSON Schema values into ``msg_type`` (dataclass, msgspec.Struct, dict).

    ``registry``: a :class:`SchemaRegistry` or its URL (required). ``validate=False`` skips
    validation against the writer schema (the message type still checks the fields).
    """

    schema_type = "JSON"

    def __init__(
        self,
        msg_type: Any = dict,
        *,
        registry: SchemaRegistry | str | None = None,
        validate: bool = True,
        strict: bool = True,
        via: Codec[Any] | None = None,
        subject_name_strategy: str = "",
        subject_topic: str = "",
        use_latest_version: bool = False,
    ) -> None:
        resolved = as_registry(registry)
        if resolved is None:
            raise ConfigError("JsonSchemaCodec needs a schema registry (codec.registry_url)")
        super().__init__(
            msg_type,
            registry=resolved,
            strict=strict,
            via=via,
            subject_name_strategy=subject_name_strategy,
            subject_topic=subject_topic,
            use_latest_version=use_latest_version,
        )
        self.validate = validate

    def _settings(self) -> tuple[Any, ...]:
        return (*super()._settings(), self.validate)

    def _paths(self) -> tuple[Deserialize, Prepare | None]:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        assert self.registry is not None
        deserializer = JSONDeserializer(
            None,
            schema_registry_client=registry_client(self.registry),
            conf={"validate": self.validate, **self._subject_config()},
        )

        ctx = self._context()

        def deserialize(value: bytes) -> Any:
            return deserializer(value, ctx)

        # confluent's deserializer for every record: the fast path covers Avro and Protobuf.
        return deserialize, None
