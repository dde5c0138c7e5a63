"""The typed processor API: what a user writes to turn ordered records into state and rows.

A :class:`Processor` sees the records of one topic-partition in exact offset order. State is
kept per key (``key(msg)``), created by ``initial_state(key)`` and checkpointed by inorder after
every micro-batch. Output rows are instances of the processor's ``Out`` type; inorder adds the
``topic``, ``partition``, ``offset`` and ``batch_id`` columns to every row itself.

Pitfalls worth knowing:

* ``process`` must be deterministic for a given state and record (no wall clock, no random
  numbers): after a crash a micro-batch is re-run and must produce the same rows, or the
  exactly-once guarantee of the output turns into "one of two different answers".
  Use ``ctx.processing_time`` (fixed per micro-batch, recorded in the checkpoint) instead of
  ``datetime.now()``.
* State objects are mutated in place and written back after each micro-batch, so the state
  type must be mutable (a plain dataclass, a non-frozen ``msgspec.Struct``). To start a key
  over, call ``ctx.reset_session()``: the next record for the key gets ``initial_state``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    NamedTuple,
    Protocol,
    TypeVar,
    get_args,
    get_origin,
)

from inorder.records import Header as Header

if TYPE_CHECKING:
    from inorder.codecs.base import Codec
    from inorder.integrity import Integrity

Msg = TypeVar("Msg")
State = TypeVar("State")
Out = TypeVar("Out")


class Context(Protocol):
    """Where the current record came from, and the controls a processor has over its key.

    In :meth:`Processor.on_timeout` the record fields describe the last record applied to the
    key (so a row emitted by a timeout still names a real Kafka offset).
    """

    @property
    def topic(self) -> str:
        """Kafka topic of the record."""
        ...

    @property
    def partition(self) -> int:
        """Kafka partition of the record."""
        ...

    @property
    def offset(self) -> int:
        """Kafka offset of the record."""
        ...

    @property
    def timestamp(self) -> datetime | None:
        """Kafka record timestamp (UTC), if the broker gave one."""
        ...

    @property
    def key(self) -> bytes | None:
        """Raw Kafka record key (the same as :attr:`kafka_key`)."""
        ...

    @property
    def kafka_key(self) -> bytes | None:
        """The Kafka record's key, raw bytes: not the state key (see :attr:`state_key`)."""
        ...

    @property
    def state_key(self) -> str | None:
        """The state key this call is for: ``Processor.key(msg)``, or the key whose timeout
        or reset this is. ``None`` outside a call."""
        ...

    @property
    def headers(self) -> Sequence[Header]:
        """Kafka record headers (empty unless the source includes them)."""
        ...

    @property
    def watermark(self) -> datetime | None:
        """Event-time watermark of this partition: max event time seen minus allowed lateness."""
        ...

    @property
    def processing_time(self) -> datetime:
        """Processing time of the micro-batch (fixed per batch, stable across re-runs)."""
        ...

    @property
    def batch_id(self) -> int:
        """Micro-batch id."""
        ...

    def set_timeout(self, when: timedelta | datetime, *, event_time: bool = False) -> None:
        """Call :meth:`Processor.on_timeout` for this key once ``when`` has passed.

        ``when`` is a delay from now (processing time, or the record's event time when
        ``event_time`` is true) or an absolute instant. Processing-time timeouts fire at the
        end of the first micro-batch whose processing time is past the deadline (also in
        micro-batches with no new records); event-time timeouts fire as soon as the
        partition's watermark passes the deadline. A key has at most one timeout: setting a
        new one replaces the old.
        """
        ...

    def clear_timeout(self) -> None:
        """Cancel this key's pending timeout."""
        ...

    def reset_session(self) -> None:
        """Drop this key's state after the current call; the next record starts afresh."""
        ...


class Violation(Exception):
    """Raised by :meth:`Processor.process` when a message breaks an integrity rule of its key.

    The engine handles it by the pipeline's policy (``fail``, ``restart_session``,
    ``dead_letter``); the key's state is left as it was before the call.
    """

    def __init__(self, rule: str, detail: str, *, fatal: bool = False) -> None:
        super().__init__(f"{rule}: {detail}")
        self.rule = rule
        self.detail = detail
        #: True when no policy may set the record aside: the run stops before committing
        #: it, whatever ``on_violation`` says. For a problem only a change of settings can
        #: fix (a source's schema changed under ``row_type``), where skipping or resetting
        #: would quietly drop every later record of the kind.
        self.fatal = fatal


class Duplicate(Exception):
    """Raised by :meth:`Processor.process` for a message the source delivered again.

    At-least-once sources (Debezium after a connector restart) re-send events they had
    already sent. A processor that can recognise one (a source position at or below the
    key's last applied one, with the same content) raises this instead of applying it: the
    engine skips the record, counts it as ``duplicates`` in the progress line, and it is
    neither applied twice nor a violation. The key's state must be left untouched.
    """


class Processor(abc.ABC, Generic[Msg, State, Out]):
    """A typed, ordered, stateful function from decoded messages to output rows.

    Subclass it with concrete types, e.g. ``class RunningMean(Processor[Reading, Stats, Row])``.
    The types are read at pipeline start: ``State`` must be a dataclass, a ``msgspec.Struct``
    or a pydantic model; ``Out`` defines the output schema (see :mod:`inorder.schema`).

    When the types are only known at run time, set :attr:`msg_type`, :attr:`state_type` and
    :attr:`out_type` (on the class or in ``__init__``): set ones win over the generic
    arguments. :meth:`default_codec` and :meth:`default_integrity` let a processor bring the
    codec and integrity its messages need; a pipeline's own settings win over them.
    """

    #: The message type, when the generic argument cannot say it (``None``: read it there).
    msg_type: Any = None
    #: The state type, when the generic argument cannot say it.
    state_type: Any = None
    #: The output row type, when the generic argument cannot say it.
    out_type: Any = None

    @abc.abstractmethod
    def key(self, msg: Msg) -> str:
        """The state key of a message (e.g. its session id)."""

    @abc.abstractmethod
    def initial_state(self, key: str) -> State:
        """A fresh state for a key that has none."""

    @abc.abstractmethod
    def process(self, state: State, msg: Msg, ctx: Context) -> Iterable[Out]:
        """Apply one message to its key's state (mutating it) and yield output rows."""

    def on_timeout(self, state: State, key: str, ctx: Context) -> Iterable[Out]:
        """Called once when this key's timeout is due. Default: emit nothing, keep state."""
        return ()

    def record_key(self, kafka_key: bytes | None) -> str | None:
        """The state key to blame for a record that could not be decoded into a message.

        Default: none (the violation is reported for the partition only). Processors whose
        Kafka key is the state key (e.g. a session id) return it decoded.
        """
        return None

    def starts_session(self, msg: Msg) -> bool:
        """Whether ``msg`` begins a new session (e.g. a snapshot).

        Under the ``restart_session`` policy a key that broke a rule is ignored until a
        message for which this returns true. Default: never; a pipeline refuses to start
        with that policy unless the processor overrides this (a key would stay ignored).
        """
        return False

    def on_reset(self, key: str, violation: Violation, ctx: Context) -> Iterable[Out]:
        """Rows to emit when the engine drops a key's state after a violation (default none)."""
        return ()

    def event_time(self, msg: Msg, ctx: Context) -> datetime | None:
        """Event time of a message, for the watermark. Default: the Kafka timestamp."""
        return ctx.timestamp

    def default_codec(self) -> Codec[Msg] | None:
        """The codec for this processor's messages when the pipeline names none.

        Default ``None``: JSON decoded into the message type.
        """
        return None

    def default_integrity(self) -> Integrity | None:
        """The integrity to enforce when the pipeline names none.

        Default ``None``: ``Integrity.strict()`` (offset order, stop at the first violation).
        """
        return None

    def check_integrity(self, integrity: Integrity) -> None:
        """Refuse, before anything runs, an integrity this processor's input cannot honour.

        Raise :class:`~inorder.errors.ConfigError` with one line naming the setting. Default:
        accept any.
        """
        return None

    def identity_options(self) -> dict[str, str]:
        """Options that change this processor's output for the same input.

        They are recorded in the checkpoint beside the processor's class: a later run with
        other values is refused unless its changes are accepted (``inorder run
        --accept-changes``), because the checkpoint has moved past records that the new
        values would read differently. Default: none.
        """
        return {}


class ProcessorTypes(NamedTuple):
    """The concrete ``Msg``, ``State`` and ``Out`` types of a processor."""

    msg: Any
    state: Any
    out: Any


def processor_types(processor: Processor[Any, Any, Any]) -> ProcessorTypes:
    """Read ``Msg``/``State``/``Out`` from the processor class's ``Processor[...]`` base.

    A processor may instead set the class attributes ``msg_type``, ``state_type`` and
    ``out_type`` (useful when the types are built at run time); those win.
    """
    found: tuple[Any, ...] | None = None
    for klass in type(processor).__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if get_origin(base) is Processor:
                args = get_args(base)
                if args and not any(isinstance(a, TypeVar) for a in args):
                    found = args
                    break
        if found:
            break
    explicit = [processor.msg_type, processor.state_type, processor.out_type]
    if found is None and not all(explicit):
        raise TypeError(
            f"{type(processor).__name__}: cannot tell its message, state and output types; "
            "subclass Processor[Msg, State, Out] with concrete types"
        )
    base_types = found or (None, None, None)
    return ProcessorTypes(
        *(e if e is not None else b for e, b in zip(explicit, base_types, strict=True))
    )
