"""The raw codec: the record's key and value bytes, undecoded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A Kafka record's key and value as bytes."""

    key: bytes | None
    value: bytes | None


class RawCodec:
    """Passes records through as :class:`RawMessage`."""

    def decode(self, value: bytes | None, key: bytes | None) -> RawMessage:
        """Wrap key and value."""
        return RawMessage(key=key, value=value)
