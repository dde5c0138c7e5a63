"""What ``inorder validate`` reports: per topic-partition and for the whole pipeline."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from inorder.listing import named, topics_and_partitions

#: Partitions the report gives a line each (beyond: only those not plainly OK).
LISTED = 20


@dataclass
class PartitionDiff:
    """Validation result of one topic-partition."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int | None
    records: int = 0
    expected_rows: int = 0
    actual_rows: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    first_offset: int | None = None
    exact_batches: bool = True
    started_from_version: int | None = None
    failed: str | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    unchecked_from: int | None = None
    """First offset of output rows whose records expired from Kafka (not checkable)."""
    unchecked_to: int | None = None
    """Kafka's log-start offset: records below it can no longer be recomputed."""
    unchecked_rows: int = 0
    set_aside: dict[str, int] = field(default_factory=dict)
    """Records the integrity policy set aside, by rule (``ignored``: records of reset
    sessions skipped until a new one): the output holds nothing for them, by design."""

    @property
    def checkable(self) -> bool:
        """Whether every output row in the compared range could be recomputed."""
        return self.unchecked_rows == 0

    @property
    def ok(self) -> bool:
        """No discrepancy and no failure."""
        return not (self.missing or self.extra or self.different or self.failed)

    def line(self) -> str:
        """One human line."""
        where = f"{self.topic}[{self.partition}]"
        span = f"offsets {self.from_offset}..{'' if self.to_offset is None else self.to_offset}"
        unchecked = (
            f"; {self.unchecked_rows:,} output rows of offsets {self.unchecked_from}.."
            f"{self.unchecked_to} NOT CHECKABLE: records they depend on expired from Kafka"
            if self.unchecked_rows
            else ""
        )
        aside = (
            "; set aside by the policy: "
            + ", ".join(f"{rule}={n:,}" for rule, n in sorted(self.set_aside.items()))
            if self.set_aside
            else ""
        )
        if self.ok:
            rows = f"{self.expected_rows:,} rows match ({self.records:,} records)"
            status = "ASIDE" if self.set_aside else "OK   " if self.checkable else "NOCHK"
            return f"{status} {where} {span}: {rows}{aside}{unchecked}"
        text = (
            f"DIFF  {where} {span}: first differing offset {self.first_offset}, "
            f"missing {self.missing:,}, extra {self.extra:,}, different {self.different:,} "
            f"(expected {self.expected_rows:,} rows, output has {self.actual_rows:,})"
        )
        if self.failed:
            text += f"; recomputation stopped: {self.failed}"
        return text + unchecked


@dataclass
class ValidationReport:
    """Validation result of a pipeline."""

    partitions: list[PartitionDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every partition matches."""
        return all(p.ok for p in self.partitions)

    @property
    def set_aside(self) -> int:
        """Records the policy set aside over all partitions (their own class: not a
        discrepancy between output and recomputation, but input the output does not hold)."""
        return sum(sum(p.set_aside.values()) for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "partitions": [
                asdict(p) | {"ok": p.ok, "checkable": p.checkable} for p in self.partitions
            ],
            "checkable": all(p.checkable for p in self.partitions),
            "notes": self.notes,
            "set_aside": self.set_aside,
            "totals": {
                k: sum(getattr(p, k) for p in self.partitions)
                for k in (
                    "records",
                    "expected_rows",
                    "actual_rows",
                    "missing",
                    "extra",
                    "different",
                )
            },
        }

    def partition_lines(self, full: bool = False) -> list[str]:
        """A line per partition; past :data:`LISTED` partitions (not ``full``) the partitions
        that match are one line of totals and only the others keep a line each (the first
        :data:`LISTED` of them; the rest named in a line, counted, never dropped)."""
        if full or len(self.partitions) <= LISTED:
            return [p.line() for p in self.partitions]
        plain = [p for p in self.partitions if p.ok and p.checkable and not p.set_aside]
        others = [p for p in self.partitions if not (p.ok and p.checkable and not p.set_aside)]
        out = []
        if plain:
            names = [f"{p.topic}[{p.partition}]" for p in plain]
            rows = sum(p.expected_rows for p in plain)
            records = sum(p.records for p in plain)
            out.append(
                f"OK    {topics_and_partitions(names)}: {rows:,} rows match ({records:,} "
                "records); --all for a line each"
            )
        out.extend(p.line() for p in others[:LISTED])
        rest = others[LISTED:]
        if rest:
            out.append(
                f"... and {len(rest):,} more partition(s) not plainly OK (DIFF, ASIDE or NOCHK): "
                + named([f"{p.topic}[{p.partition}]" for p in rest])
                + "; --all for a line each"
            )
        return out

    def lines(self, full: bool = False) -> list[str]:
        """Human-readable report (``full``: a line per partition, however many)."""
        out = self.partition_lines(full)
        bad = [p for p in self.partitions if not p.ok]
        unchecked = [p for p in self.partitions if not p.checkable]
        out.append(
            f"{len(self.partitions)} partition(s) checked, "
            + (
                f"{len(bad)} with discrepancies"
                if bad
                else "the output matches its recomputation"
                if self.set_aside
                else "no discrepancy"
            )
            + (
                f"; {len(unchecked)} with output rows not checkable (records expired from "
                f"Kafka: {sum(p.unchecked_rows for p in unchecked):,} rows)"
                if unchecked
                else ""
            )
        )
        aside = [p for p in self.partitions if p.set_aside]
        if aside:
            out.append(
                f"{self.set_aside:,} record(s) in {len(aside)} partition(s) were set aside by the "
                "integrity policy (see ASIDE lines): the output holds nothing for them, as the "
                "policy decided; not lost in transit, but not in the output either"
            )
        out.extend(f"note: {n}" for n in self.notes)
        return out
