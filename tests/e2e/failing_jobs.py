"""A raw-bytes processor that fails on demand (importable by Spark workers): a test stops a
run in the middle of a batch that Spark has planned, with nothing of it committed."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.e2e.cli_jobs import CountRaw, Seen, SeenRow

from inorder import Context


class FailWhileFlagged(CountRaw):
    """Counts records; a ``boom`` record fails its batch while the file ``flag`` exists."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def process(self, state: Seen, msg: bytes, ctx: Context) -> Iterable[SeenRow]:
        # The raw codec hands over a RawMessage (key and value), not the value's bytes.
        if getattr(msg, "value", msg) == b"boom" and Path(self.flag).exists():
            raise RuntimeError("boom: failing this batch on purpose")
        yield from super().process(state, msg, ctx)
