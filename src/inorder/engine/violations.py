"""What the ordered apply reports when a record or a timeout breaks a rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Rule name for exceptions (other than Violation) raised by user code.
PROCESSOR_ERROR = "processor_error"
#: Rule name for a row that does not fit the output schema exactly (never coerced).
ROW_SCHEMA = "row_schema"


@dataclass(frozen=True, slots=True)
class ViolationEvent:
    """A record (or timeout) that broke a rule, and the policy applied."""

    topic: str
    partition: int
    offset: int
    key: str | None
    rule: str
    detail: str
    policy: str

    def message(self) -> str:
        """One line naming topic, partition, offset, key and rule."""
        key = "unknown" if self.key is None else repr(self.key)
        return (
            f"{self.rule} at {self.topic}[{self.partition}] offset {self.offset} "
            f"(key {key}): {self.detail}"
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "key": self.key,
            "rule": self.rule,
            "detail": self.detail,
            "policy": self.policy,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ViolationEvent:
        """Inverse of :meth:`to_json`."""
        return cls(
            str(data["topic"]),
            int(data["partition"]),
            int(data["offset"]),
            data.get("key"),
            str(data["rule"]),
            str(data["detail"]),
            str(data["policy"]),
        )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record routed to the dead-letter output, with the reason."""

    offset: int
    kafka_key: bytes | None
    value: bytes | None
    timestamp_us: int | None
    key: str | None
    rule: str
    detail: str
