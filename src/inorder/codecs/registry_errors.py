"""Named failures of the schema-registry codecs (Avro, Protobuf, JSON Schema).

Bad records are :class:`~inorder.codecs.base.DecodeError` subclasses: the engine reports them
as the ``undecodable`` integrity rule (with topic, partition and offset) and handles them by the
pipeline's policy. Each kind has its own class and its own message text, so a dead letter or a
failed run says which one it was.

A registry that cannot answer is not a bad record: :class:`RegistryUnavailableError` is raised
out of the task, the micro-batch fails and re-runs on restart, and nothing is skipped or
dead-lettered.
"""

from __future__ import annotations

from inorder.codecs.base import DecodeError
from inorder.errors import InorderError


class SchemaDecodeError(DecodeError, InorderError):
    """A record that a schema-registry codec cannot turn into a message."""


class FramingError(SchemaDecodeError):
    """The value is too short to hold Schema Registry framing (magic byte + schema id)."""


class WrongMagicByteError(FramingError):
    """The value's first byte is not Schema Registry's magic byte (0, or 1 for a GUID)."""


class UnknownSchemaIdError(SchemaDecodeError):
    """The record names a schema id that the registry does not hold (HTTP 404)."""


class UnresolvableSchemaError(SchemaDecodeError):
    """The writer's schema cannot be read with the reader schema (Avro resolution rules)."""


class MalformedPayloadError(SchemaDecodeError):
    """The bytes after the framing do not decode with (or validate against) the writer schema."""


class RegistryUnavailableError(InorderError):
    """The schema registry did not answer (refused, timed out, 5xx, refused credentials).

    Raised out of the task after the client's retries: the batch fails and re-runs on restart.
    """
