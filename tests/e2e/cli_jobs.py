"""Small raw-bytes processors the end-to-end tests run (importable by Spark workers)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from inorder import Context, Processor


@dataclass
class Seen:
    n: int = 0


@dataclass
class SeenRow:
    key: str
    n: int


class CountRaw(Processor[bytes, Seen, SeenRow]):
    """Counts records per Kafka key."""

    def key(self, msg: bytes) -> str:
        return "all"

    def initial_state(self, key: str) -> Seen:
        return Seen()

    def process(self, state: Seen, msg: bytes, ctx: Context) -> Iterable[SeenRow]:
        state.n += 1
        yield SeenRow((ctx.key or b"").decode(), state.n)


@dataclass
class Reading:
    site: str
    value: int


@dataclass
class Half:
    site: str
    half: int


class Halver(Processor[Reading, Seen, Half]):
    """Halves each value into an int field: odd values yield a float (a row that does not fit)."""

    def key(self, msg: Reading) -> str:
        return msg.site

    def initial_state(self, key: str) -> Seen:
        return Seen()

    def process(self, state: Seen, msg: Reading, ctx: Context) -> Iterable[Half]:
        state.n += 1
        yield Half(msg.site, msg.value / 2 if msg.value % 2 else msg.value // 2)  # type: ignore[arg-type]


class CountReadings(Processor[Reading, Seen, SeenRow]):
    """Counts readings per site (a message type with fields, for ``sequence_field``)."""

    def key(self, msg: Reading) -> str:
        return msg.site

    def initial_state(self, key: str) -> Seen:
        return Seen()

    def process(self, state: Seen, msg: Reading, ctx: Context) -> Iterable[SeenRow]:
        state.n += 1
        yield SeenRow(msg.site, state.n)


class CountRawSessions(CountRaw):
    """Counts records; an empty record begins a new session (fit for ``restart_session``)."""

    def starts_session(self, msg: bytes) -> bool:
        return msg == b""


class GatedCountRaw(CountRaw):
    """Counts records; a ``gate`` record holds its batch until the file ``opened`` exists.

    It first creates ``waiting``, so a test knows the batch is running (an event, not a
    guess at how long starting takes) and can open the gate again when it is done.
    """

    def __init__(self, waiting: str, opened: str) -> None:
        self.waiting = waiting
        self.opened = opened

    def process(self, state: Seen, msg: bytes, ctx: Context) -> Iterable[SeenRow]:
        # The raw codec hands over a RawMessage (key and value), not the value's bytes.
        if getattr(msg, "value", msg) == b"gate":
            Path(self.waiting).touch()
            while not Path(self.opened).exists():
                time.sleep(0.05)
        yield from super().process(state, msg, ctx)
