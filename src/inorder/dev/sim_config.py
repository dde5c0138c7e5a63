"""What a simulation is asked to do: sites, sessions, operation mix and fault rates.

:class:`SimulationConfig` holds every setting of ``inorder simulate`` and checks them, naming
the command-line option of a bad value; :class:`FaultRates` and :class:`OpMix` parse their
options' text. :mod:`inorder.dev.sim_model` turns a config into records.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any

from inorder.errors import ConfigError


class FaultKind(enum.StrEnum):
    """An injected fault, and the first record a consumer sees as violating the contract.

    * ``drop``: the message is never sent; the session's next message shows a seq gap.
    * ``duplicate``: the message is sent twice in a row; the second copy repeats its seq.
    * ``swap``: two consecutive messages of the session are sent in reverse order; the first
      record sent (the later seq) shows a seq gap, the second then a lower seq.
    * ``malformed``: the value bytes are cut in half (not valid JSON); that record is the
      violation (its change is lost, so the session's next message also shows a seq gap).
    """

    DROP = "drop"
    DUPLICATE = "duplicate"
    SWAP = "swap"
    MALFORMED = "malformed"


@dataclass(frozen=True)
class FaultRates:
    """Per-message probability of each fault in a faulty session (their sum is at most 1)."""

    drop: float = 0.0
    duplicate: float = 0.0
    swap: float = 0.0
    malformed: float = 0.0

    @classmethod
    def parse(cls, text: str) -> FaultRates:
        """Parse ``drop=0.01,duplicate=0.005,swap=0,malformed=0.001`` (any subset)."""
        values: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, raw = item.partition("=")
            name = name.strip()
            if not sep or name not in {k.value for k in FaultKind}:
                raise ConfigError(
                    f"--fault-rate: expected KIND=RATE with KIND one of drop, duplicate, swap, "
                    f"malformed; got {item!r}"
                )
            try:
                values[name] = float(raw)
            except ValueError:
                raise ConfigError(f"--fault-rate: {name} rate {raw!r} is not a number") from None
        return cls(**values)

    def total(self) -> float:
        """Probability that a message of a faulty session is hit by some fault."""
        return self.drop + self.duplicate + self.swap + self.malformed

    def as_dict(self) -> dict[str, float]:
        """The rates by fault kind name."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class OpMix:
    """Relative weights of insert, update and delete messages between snapshots."""

    insert: float = 1.0
    update: float = 3.0
    delete: float = 1.0

    @classmethod
    def parse(cls, text: str) -> OpMix:
        """Parse ``insert:update:delete`` weights, e.g. ``1:3:1``."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ConfigError(f"--mix: expected INSERT:UPDATE:DELETE weights, got {text!r}")
        try:
            insert, update, delete = (float(p) for p in parts)
        except ValueError:
            raise ConfigError(f"--mix: weights must be numbers, got {text!r}") from None
        return cls(insert, update, delete)


@dataclass(frozen=True)
class SimulationConfig:
    """What to simulate. Sites are topics ``<topic_prefix><NNN>``; late sites come after them.

    ``messages`` counts generated messages (a dropped message counts, a duplicate does not);
    the run stops at ``messages`` or ``duration`` seconds, whichever comes first (``None``:
    no limit of that kind; at least one must be set).
    """

    sites: int = 3
    topic_prefix: str = "site-"
    partitions: int = 4
    sessions_per_site: int = 4
    rows_per_snapshot: int = 10
    messages: int | None = 10_000
    duration: float | None = None
    rate: float = 0.0
    mix: OpMix = field(default_factory=OpMix)
    restart_every: int = 0
    end_probability: float = 0.0
    late_sites: int = 0
    late_after: float = 0.5
    faults: FaultRates = field(default_factory=FaultRates)
    faulty_sessions: float = 0.25
    seed: int = 0
    start_ts: float = 1_731_000_000.0
    ts_step: float = 0.001

    def validate(self) -> None:
        """Raise :class:`ConfigError` (naming the option) if any setting is invalid."""
        _at_least("--sites", self.sites, 1)
        _at_least("--partitions", self.partitions, 1)
        _at_least("--sessions-per-site", self.sessions_per_site, 1)
        _at_least("--rows-per-snapshot", self.rows_per_snapshot, 0)
        _at_least("--restart-every", self.restart_every, 0)
        _at_least("--late-sites", self.late_sites, 0)
        if self.messages is None and self.duration is None:
            raise ConfigError("give --messages or --duration")
        if self.messages is not None:
            _at_least("--messages", self.messages, 1)
        if self.duration is not None and not (_finite(self.duration) and self.duration > 0):
            raise ConfigError(f"--duration must be > 0 seconds, got {self.duration}")
        if not (_finite(self.rate) and self.rate >= 0):
            raise ConfigError(f"--rate must be >= 0 messages/s (0 = unlimited), got {self.rate}")
        _probability("--end-probability", self.end_probability)
        _probability("--faulty-sessions", self.faulty_sessions)
        _probability("--late-after", self.late_after)
        weights = (self.mix.insert, self.mix.update, self.mix.delete)
        if any(not (_finite(w) and w >= 0) for w in weights) or sum(weights) <= 0:
            raise ConfigError(f"--mix weights must be >= 0 with a positive sum, got {weights}")
        for name, rate in self.faults.as_dict().items():
            _probability(f"--fault-rate {name}", rate)
        if self.faults.total() > 1:
            raise ConfigError(f"--fault-rate: rates sum to {self.faults.total()}, above 1")
        if not self.topic_prefix or any(c.isspace() or c == "/" for c in self.topic_prefix):
            raise ConfigError(f"--topic-prefix {self.topic_prefix!r} is not a valid topic prefix")
        if not (_finite(self.start_ts) and _finite(self.ts_step) and self.ts_step >= 0):
            raise ConfigError("start_ts and ts_step must be finite, ts_step >= 0")

    def topic(self, site: int) -> str:
        """Topic of site number ``site`` (late sites are numbered after the others)."""
        return f"{self.topic_prefix}{site:03d}"

    def initial_topics(self) -> list[str]:
        """Topics of the sites present from the start."""
        return [self.topic(i) for i in range(self.sites)]

    def late_topics(self) -> list[str]:
        """Topics of the sites that appear mid-run."""
        return [self.topic(i) for i in range(self.sites, self.sites + self.late_sites)]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (recorded in the ground truth)."""
        return {
            "sites": self.sites,
            "topic_prefix": self.topic_prefix,
            "partitions": self.partitions,
            "sessions_per_site": self.sessions_per_site,
            "rows_per_snapshot": self.rows_per_snapshot,
            "messages": self.messages,
            "duration": self.duration,
            "rate": self.rate,
            "mix": [self.mix.insert, self.mix.update, self.mix.delete],
            "restart_every": self.restart_every,
            "end_probability": self.end_probability,
            "late_sites": self.late_sites,
            "late_after": self.late_after,
            "faults": self.faults.as_dict(),
            "faulty_sessions": self.faulty_sessions,
            "seed": self.seed,
            "start_ts": self.start_ts,
            "ts_step": self.ts_step,
        }


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _at_least(option: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{option} must be an integer >= {minimum}, got {value!r}")


def _probability(option: str, value: float) -> None:
    if not (_finite(value) and 0 <= value <= 1):
        raise ConfigError(f"{option} must be between 0 and 1, got {value!r}")
