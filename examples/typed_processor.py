"""A typed processor: the running mean per site from the design (checked by ``mypy --strict``).

Run it to see the output schema inorder derives from ``StatsRow`` and the state fingerprint it
keeps in the checkpoint::

    python examples/typed_processor.py

Run it as a pipeline over topics ``readings-*`` of the dev broker (``inorder dev up``)::

    inorder run examples.typed_processor:pipeline --trigger available-now

``INORDER_EXAMPLE_TOPICS``, ``INORDER_EXAMPLE_OUTPUT`` and ``INORDER_EXAMPLE_CHECKPOINT``
override the topic pattern, output and checkpoint locations.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from inorder import Context, JsonCodec, KafkaSource, ParquetSink, Pipeline, Processor
from inorder.endpoints import kafka_bootstrap_servers
from inorder.schema import RowEncoder, output_schema
from inorder.state.codec import StateCodec


@dataclass
class Reading:
    """The decoded Kafka value: ``{"site": "s1", "value": 2.5}``."""

    site: str
    value: float
    unit: str | None = None


@dataclass
class SiteStats:
    """State per site. New fields need defaults so state from older versions still loads."""

    count: int = 0
    total: float = 0.0
    units: list[str] = field(default_factory=list)


@dataclass
class StatsRow:
    """One output row per reading; inorder adds topic, partition, offset and batch_id."""

    site: str
    count: int
    mean: float
    seen_at: datetime | None


class RunningMean(Processor[Reading, SiteStats, StatsRow]):
    """Running count and mean of ``value`` per site."""

    def key(self, msg: Reading) -> str:
        return msg.site

    def initial_state(self, key: str) -> SiteStats:
        return SiteStats()

    def process(self, state: SiteStats, msg: Reading, ctx: Context) -> Iterable[StatsRow]:
        state.count += 1
        state.total += msg.value
        if msg.unit is not None and msg.unit not in state.units:
            state.units.append(msg.unit)
        yield StatsRow(msg.site, state.count, state.total / state.count, ctx.timestamp)


CODEC: JsonCodec[Reading] = JsonCodec(Reading)


def pipeline() -> Pipeline[Reading, SiteStats, StatsRow]:
    """The running-mean job over ``readings-*`` topics, landed as Parquet."""
    return Pipeline(
        source=KafkaSource(
            bootstrap_servers=kafka_bootstrap_servers(),
            topic_pattern=os.environ.get("INORDER_EXAMPLE_TOPICS", "readings-.*"),
        ),
        processor=RunningMean(),
        codec=CODEC,
        sink=ParquetSink(
            os.environ.get("INORDER_EXAMPLE_OUTPUT", "out/readings"),
            partition_by=["topic"],
            compression="zstd",
        ),
        checkpoint=os.environ.get("INORDER_EXAMPLE_CHECKPOINT", ".inorder/checkpoints/readings"),
        trigger="15 minutes",
    )


def main() -> None:
    """Print the derived output schema, a sample batch and the state fingerprint."""
    print(output_schema(StatsRow))
    reading = CODEC.decode(b'{"site": "s1", "value": 2.5, "unit": "C"}', None)
    state = RunningMean().initial_state(reading.site)
    state.count, state.total = 1, reading.value
    row = StatsRow(reading.site, state.count, state.total / state.count, None)
    batch = RowEncoder(StatsRow).encode_with_origin([row], "readings", 0, [42], batch_id=1)
    print(batch.to_pylist())
    codec = StateCodec(SiteStats)
    assert codec.decode(codec.encode(state)) == state
    print(codec.fingerprint()["fields"])


if __name__ == "__main__":
    main()
