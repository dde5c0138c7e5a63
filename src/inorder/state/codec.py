"""State objects to bytes and back (MessagePack, field names kept).

Which changes of a state type old state survives, and the check that enforces it, are in
:mod:`inorder.state.evolution`; their public names are importable from here too.
"""

from __future__ import annotations

import copy
from typing import Any, Generic, TypeVar

import msgspec

from inorder.errors import ConfigError
from inorder.schema import is_pydantic_model, prepare_for_pickling
from inorder.state.evolution import (
    FINGERPRINT_FORMAT,
    check_compatible,
    describe_changes,
    fingerprint,
    state_type_name,
    type_string,
    validate_state_type,
)

__all__ = [
    "FINGERPRINT_FORMAT",
    "StateCodec",
    "check_compatible",
    "describe_changes",
    "fingerprint",
    "type_string",
    "validate_state_type",
]

S = TypeVar("S")


class StateCodec(Generic[S]):
    """msgpack encoder/decoder of one state type. Picklable; msgspec codecs are built lazily.

    ``decode`` reads state written by any compatible earlier version of the type (see the
    module docs); a stored value that does not fit raises ``ConfigError``.
    """

    def __init__(self, tp: type[S]) -> None:
        validate_state_type(tp)
        prepare_for_pickling(tp)
        self.tp = tp
        self._pydantic = is_pydantic_model(tp)
        self._encoder: msgspec.msgpack.Encoder | None = None
        self._decoder: msgspec.msgpack.Decoder[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        prepare_for_pickling(self.tp)
        return {"tp": self.tp}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tp = state["tp"]
        self._pydantic = is_pydantic_model(self.tp)
        self._encoder = None
        self._decoder = None

    def __repr__(self) -> str:
        return f"StateCodec({state_type_name(self.tp)})"

    def encode(self, state: S) -> bytes:
        """State to bytes."""
        enc = self._encoder
        if enc is None:
            enc = self._encoder = msgspec.msgpack.Encoder()
        if self._pydantic:
            return enc.encode(state.model_dump(mode="python"))  # type: ignore[attr-defined]
        return enc.encode(state)

    def decode(self, data: bytes) -> S:
        """Bytes (possibly written by an older compatible type) to state."""
        dec = self._decoder
        if dec is None:
            dec = self._decoder = msgspec.msgpack.Decoder(Any if self._pydantic else self.tp)
        try:
            value = dec.decode(data)
            if self._pydantic:
                value = self.tp.model_validate(value)  # type: ignore[attr-defined]
        except msgspec.ValidationError as exc:
            raise ConfigError(
                f"state type {state_type_name(self.tp)}: stored state does not fit the type: {exc}"
            ) from None
        except Exception as exc:
            if type(exc).__name__ == "ValidationError":  # pydantic's
                raise ConfigError(
                    f"state type {state_type_name(self.tp)}: stored state does not fit the type: "
                    f"{str(exc).splitlines()[0]}"
                ) from None
            raise
        result: S = value
        return result

    def copy(self, state: S) -> S:
        """An independent copy of ``state``, as a round trip through the codec.

        The engine copies a key's state before each call under the ``dead_letter`` policy (a
        rejected call leaves the state as it was); the round trip is 5-10x cheaper than
        ``copy.deepcopy`` (measured: 0.4 vs 4.1 µs for a two-field dataclass, 8 vs 44 µs
        for 100 rows in a dict) and gives what a reload from the checkpoint gives.
        """
        try:
            return self.decode(self.encode(state))
        except Exception:  # a state the codec cannot take: the commit names it; copy as before
            return copy.deepcopy(state)

    def fingerprint(self) -> dict[str, Any]:
        """See :func:`fingerprint`."""
        return fingerprint(self.tp)
