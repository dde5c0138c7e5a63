"""The registry codecs' fast path: confluent-kafka decodes the first record of each framing.

confluent-kafka's deserializers redo, for every record, work that depends only on the writer
schema: the framing is read in Python (``SchemaId.from_bytes``, a varint loop for Protobuf's
message indexes), the writer schema is looked up in the client's cache under its lock, the
Avro reader schema is expanded again (``expand_schema``) and the Protobuf message descriptor
found again. Per record that is several times the cost of decoding the payload itself.

:class:`SchemaCache` keeps confluent's deserializer as the authority and only memoizes what it
established. The first record with a given framing (magic byte, schema id or GUID, Protobuf
message indexes) goes through the deserializer, which fetches and resolves the writer schema or
raises; once it has decoded a record, the framing bytes that confluent's own framing reader
(``dual_schema_id_deserializer``) consumed are remembered with a decoder for the payload built
from the same resolved schemas (fastavro's ``schemaless_reader`` with the writer and reader
schemas the deserializer parsed; the Protobuf message class's ``FromString``). A later record
that starts with exactly those bytes has the same framing, because the framing reader decides
how much to read from the bytes it has read; its payload goes straight to the decoder.

Anything else goes to the deserializer, so every error is confluent's: a value that matches
no remembered framing (wrong magic byte, unknown or new schema id, too short), and a record
whose payload the cached decoder rejects (decoded again by the deserializer, which raises its
own error). Nothing is remembered for a record that failed, so an outage caches nothing.

The fast path is taken only where the deserializer has no per-record decisions left once the
writer schema is known: no subject name strategy (no subject, so no latest-version reads, no
migrations, no rule executors) and, for Avro, a writer schema other than plain ``bytes``.
:func:`pick_path` is the one place that decides; ``tests/unit/test_registry_fast_path.py``
runs both paths on the same records, errors included.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: A record value to plain data (or a Protobuf message): confluent's deserializer, or a plain
#: decoder when there is no registry.
Deserialize = Callable[[bytes], Any]
#: Decodes the payload of ``value`` that starts at the given offset (after the framing).
PayloadDecoder = Callable[[bytes, int], Any]
#: Builds the payload decoder for a framing confluent's deserializer has just accepted, from
#: confluent's ``SchemaId``; None: records of this schema always take the deserializer.
Prepare = Callable[[Any], PayloadDecoder | None]


class SchemaCache:
    """confluent's deserializer for each new framing, a remembered payload decoder after.

    ``schema_type``: confluent's name (``AVRO``, ``PROTOBUF``). ``min_length``: values shorter
    than this always take the deserializer (confluent's Avro deserializer refuses values of 5
    bytes or fewer before it reads them; a cached decoder of a schema that reads no bytes
    would accept them).
    """

    def __init__(
        self, slow: Deserialize, schema_type: str, prepare: Prepare, min_length: int = 0
    ) -> None:
        self._slow = slow
        self._schema_type = schema_type
        self._prepare = prepare
        self._min_length = min_length
        # Exact framing bytes -> decoder, and the lengths of the framings seen (usually one).
        self._decoders: dict[bytes, PayloadDecoder] = {}
        self._lengths: tuple[int, ...] = ()
        self._lock = threading.Lock()

    def __call__(self, value: bytes) -> Any:
        """Decode one framed value: the one place that picks the path for a record."""
        if len(value) >= self._min_length:
            decoders = self._decoders
            for length in self._lengths:
                decoder = decoders.get(value[:length])
                if decoder is not None:
                    try:
                        return decoder(value, length)
                    except Exception:
                        break  # a bad payload: the deserializer decodes it and names the error
        return self._first(value)

    def _first(self, value: bytes) -> Any:
        """Decode with confluent's deserializer; remember its framing if it succeeded."""
        result = self._slow(value)
        from confluent_kafka.schema_registry import dual_schema_id_deserializer
        from confluent_kafka.schema_registry.common.serde import SchemaId

        schema_id = SchemaId(self._schema_type)
        length = dual_schema_id_deserializer(value, None, schema_id).tell()
        framing = value[:length]
        if framing in self._decoders:
            return result
        decoder = self._prepare(schema_id)
        if decoder is not None:
            with self._lock:
                self._decoders[framing] = decoder
                self._lengths = tuple(sorted({*self._lengths, length}))
        return result


def pick_path(
    slow: Deserialize,
    prepare: Prepare | None,
    schema_type: str,
    *,
    subject_name_strategy: str,
    min_length: int = 0,
) -> Deserialize:
    """The deserializer a codec decodes with: ``slow`` itself, or a :class:`SchemaCache`.

    ``prepare`` is None where there is no fast path (no registry: ``slow`` is then the plain
    decoder; or the library lacks what the fast path reads). A subject name strategy keeps
    confluent's deserializer for every record: it resolves a subject per record and may read
    the subject's latest version, migrate, or run the schema's rules.
    """
    if prepare is None or subject_name_strategy:
        return slow
    return SchemaCache(slow, schema_type, prepare, min_length)
