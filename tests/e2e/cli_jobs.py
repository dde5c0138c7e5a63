"""Small raw-bytes processors the end-to-end tests run (importable by Spark workers)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

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


class SlowCountRaw(CountRaw):
    """Counts records per Kafka key, slowly: a batch long enough to watch."""

    def process(self, state: Seen, msg: bytes, ctx: Context) -> Iterable[SeenRow]:
        time.sleep(0.1)
        yield from super().process(state, msg, ctx)
