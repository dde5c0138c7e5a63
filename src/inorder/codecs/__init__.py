"""Codecs: Kafka record bytes to the typed messages a processor receives."""

from inorder.codecs.avro import AvroCodec
from inorder.codecs.base import Codec, DecodeError
from inorder.codecs.json import JsonCodec
from inorder.codecs.json_schema import JsonSchemaCodec
from inorder.codecs.protobuf import ProtobufCodec
from inorder.codecs.raw import RawCodec, RawMessage
from inorder.codecs.registry_client import SchemaRegistry
from inorder.codecs.registry_errors import (
    FramingError,
    MalformedPayloadError,
    RegistryUnavailableError,
    SchemaDecodeError,
    UnknownSchemaIdError,
    UnresolvableSchemaError,
    WrongMagicByteError,
)

__all__ = [
    "AvroCodec",
    "Codec",
    "DecodeError",
    "FramingError",
    "JsonCodec",
    "JsonSchemaCodec",
    "MalformedPayloadError",
    "ProtobufCodec",
    "RawCodec",
    "RawMessage",
    "RegistryUnavailableError",
    "SchemaDecodeError",
    "SchemaRegistry",
    "UnknownSchemaIdError",
    "UnresolvableSchemaError",
    "WrongMagicByteError",
]
