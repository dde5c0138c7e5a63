"""Codecs: Kafka record bytes to the typed messages a processor receives."""

from inorder.codecs.base import Codec, DecodeError
from inorder.codecs.json import JsonCodec
from inorder.codecs.raw import RawCodec, RawMessage

__all__ = ["Codec", "DecodeError", "JsonCodec", "RawCodec", "RawMessage"]
