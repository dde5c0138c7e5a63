"""The codec contract: Kafka record bytes to the typed message a processor receives."""

from __future__ import annotations

from typing import Protocol, TypeVar

Msg_co = TypeVar("Msg_co", covariant=True)


class DecodeError(Exception):
    """A record's bytes do not form a valid message; the reason is the message text.

    The engine turns it into an integrity event naming topic, partition and offset.
    """


class Codec(Protocol[Msg_co]):
    """Decodes one Kafka record into a message. Must be picklable (sent to executors)."""

    def decode(self, value: bytes | None, key: bytes | None) -> Msg_co:
        """Decode or raise :class:`DecodeError`."""
        ...
