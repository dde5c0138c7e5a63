"""``inorder-tiered``: a topic-partition read from the archive, then from Kafka, with an exact seam.

The stream reader is the Kafka source's (same offsets, planning, discovery, data-loss rules,
markers, ticks) with two differences:

* **Watermarks**: a partition's log start is the archive's first offset when the archive
  starts below Kafka's log start, so ``earliest`` (and any offset in between) is valid even
  after Kafka deleted those records; ``startingOffsetsByTimestamp`` / ``startingTimestamp``
  look in the archive as well.
* **Reading a range** ``[start, end)``: offsets below the archive's end ``A`` (the end of its
  last committed range, known exactly from its offset index) come from the archive files,
  ``[max(start, A), end)`` from Kafka. The archive holds exactly Kafka's ``read_committed``
  records of the offsets it covers, so the records of a range are the same wherever the seam
  falls: no gap and no duplicate, in offset order, and a re-run of a micro-batch after a crash
  reads the same records even if the archive grew meanwhile.

Options: those of ``inorder-kafka`` plus ``inorder.archive`` (the archive path) and
``inorder.archiveStorageOptions`` (JSON object of S3 settings; the AWS_* environment
variables are used otherwise). The archive is read ``read_committed``: the source refuses
``kafka.isolation.level=read_uncommitted``.

:class:`TieredSource` is the pipeline-facing side (the
:class:`~inorder.kafka.source_protocol.Source` a ``Pipeline`` reads when its ``KafkaSource``
names an archive): it loads this data source and gives the operations tools
:class:`TieredOptions`, which read ranges and metadata through the archive themselves
(:class:`~inorder.kafka.source_protocol.RangeReader`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, InputPartition

from inorder.archive.coverage import Coverage, first_offset_at, load_coverage, read_archived
from inorder.errors import ConfigError
from inorder.kafka.admin import KafkaAdmin
from inorder.kafka.api import KafkaSource
from inorder.kafka.consumer import marker_batch, read_range
from inorder.kafka.input_partitions import KafkaInputPartition
from inorder.kafka.options import SourceOptions, parse_options
from inorder.kafka.planning import Watermarks
from inorder.kafka.source import KafkaStreamReader
from inorder.records import KAFKA_SPARK_DDL, TopicPartition

SOURCE_NAME = "inorder-tiered"
ARCHIVE_OPTION = "inorder.archive"
ARCHIVE_STORAGE_OPTION = "inorder.archiveStorageOptions"

#: How long the driver reuses a loaded coverage between planning calls (seconds).
COVERAGE_TTL_SECONDS = 1.0


@dataclass(frozen=True)
class TieredOptions(SourceOptions):
    """Kafka source options plus the archive to read below Kafka."""

    archive: str = ""
    archive_storage_options: Mapping[str, str] = field(default_factory=dict)

    def storage(self) -> dict[str, str] | None:
        """The archive's storage options (``None``: from the environment)."""
        return dict(self.archive_storage_options) or None

    def admin(self) -> KafkaAdmin:
        """Kafka's metadata with the archive's offsets merged in (the operations tools')."""
        return TieredAdmin(self)

    def read_records(self, tp: TopicPartition, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Records of ``tp`` in ``[start, end)``: from the archive below its end, then Kafka."""
        archive_end, files = plan_tiered(
            load_coverage(self.archive, self.storage()), tp, start, end
        )
        return read_tiered_range(
            self, tp, start, end, archive_end=archive_end, files=files, markers=False
        )


def parse_tiered_options(options: Mapping[str, str]) -> TieredOptions:
    """Validate ``inorder-tiered`` options (any case); ``ConfigError`` naming the option."""
    rest: dict[str, str] = {}
    archive = ""
    storage: dict[str, str] = {}
    for key, value in options.items():
        lowered = key.lower()
        if lowered == ARCHIVE_OPTION.lower():
            archive = str(value).strip()
        elif lowered == ARCHIVE_STORAGE_OPTION.lower():
            try:
                loaded = json.loads(value)
            except json.JSONDecodeError:
                raise ConfigError(f"{ARCHIVE_STORAGE_OPTION}: not a JSON object") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"{ARCHIVE_STORAGE_OPTION}: not a JSON object")
            storage = {str(k): str(v) for k, v in loaded.items()}
        else:
            rest[key] = value
    if not archive:
        raise ConfigError(f"{ARCHIVE_OPTION}: required (the path of an `inorder archive` dataset)")
    base = parse_options(rest)
    if base.isolation_level != "read_committed":
        raise ConfigError(
            "kafka.isolation.level: the archive holds read_committed records; "
            "a tiered source cannot read read_uncommitted"
        )
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(SourceOptions)}
    return TieredOptions(**values, archive=archive, archive_storage_options=storage)


def tiered_options_of(
    source_options: SourceOptions, archive: str, storage: Mapping[str, str] | None = None
) -> TieredOptions:
    """``source_options`` reading below Kafka from ``archive``."""
    values = {f.name: getattr(source_options, f.name) for f in dataclasses.fields(SourceOptions)}
    return TieredOptions(**values, archive=archive, archive_storage_options=dict(storage or {}))


class TieredAdmin(KafkaAdmin):
    """Kafka metadata with the archive's offsets merged in (driver side)."""

    def __init__(self, options: TieredOptions) -> None:
        super().__init__(options)
        self.tiered = options
        self._coverage: Coverage | None = None
        self._loaded_at = -float("inf")

    def coverage(self, fresh: bool = False) -> Coverage:
        """The archive's committed coverage (re-read at most every ``COVERAGE_TTL_SECONDS``)."""
        now = time.monotonic()
        if fresh or self._coverage is None or now - self._loaded_at > COVERAGE_TTL_SECONDS:
            self._coverage = load_coverage(self.tiered.archive, self.tiered.storage())
            self._loaded_at = now
        return self._coverage

    def watermarks(
        self, tps: Iterable[TopicPartition]
    ) -> tuple[dict[TopicPartition, Watermarks], set[TopicPartition]]:
        """Kafka's watermarks, with the log start lowered to the archive's first offset."""
        marks, failed = super().watermarks(tps)
        coverage = self.coverage()
        for tp, wm in list(marks.items()):
            cov = coverage.of(tp)
            if cov is not None and cov.start < wm.low:
                marks[tp] = Watermarks(cov.start, max(wm.high, cov.start))
        return marks, failed

    def offsets_for_times(
        self, times: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        """The first offset at or after each time, in the archive or in Kafka (the lower)."""
        found = super().offsets_for_times(times)
        coverage = self.coverage()
        out: dict[TopicPartition, int | None] = {}
        for tp, ms in times.items():
            archived = first_offset_at(coverage, tp, ms, self.tiered.storage())
            candidates = [o for o in (archived, found.get(tp)) if o is not None]
            out[tp] = min(candidates) if candidates else None
        return out


class TieredInputPartition(KafkaInputPartition):
    """A range ``[start, end)`` of one topic-partition plus its archive files (planned)."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        archive_end: int,
        files: list[str],
    ) -> None:
        super().__init__(topic, partition, start, end)
        self.archive_end = archive_end
        self.files = files

    def __repr__(self) -> str:
        return (
            f"TieredInputPartition({self.topic}[{self.partition}] {self.start}..{self.end}, "
            f"archive below {self.archive_end})"
        )


def read_tiered_range(
    options: TieredOptions,
    tp: TopicPartition,
    start: int,
    end: int,
    *,
    archive_end: int,
    files: list[str],
    markers: bool | None = None,
) -> Iterator[pa.RecordBatch]:
    """Records of ``[start, end)``: archived ones below ``archive_end``, then Kafka's."""
    if markers if markers is not None else options.partition_markers:
        yield marker_batch(tp, start, end)
    seam = min(max(start, archive_end), end)
    if start < seam:
        yield from read_archived(
            files,
            tp,
            start,
            seam,
            path=options.archive,
            storage_options=options.storage(),
            batch_rows=options.batch_rows,
        )
    if seam < end:
        yield from read_range(options, tp, seam, end, markers=False)


def plan_tiered(
    coverage: Coverage, tp: TopicPartition, start: int, end: int
) -> tuple[int, list[str]]:
    """Where the archive ends for ``tp`` (``-1``: nothing archived) and the files of the range."""
    cov = coverage.of(tp)
    if cov is None or start >= cov.end or start < cov.start:
        # Below the archive's start nothing is archived: Kafka has to hold it (or it is loss).
        return (-1, [])
    return (cov.end, coverage.files_for(tp, start, min(end, cov.end)))


class TieredStreamReader(KafkaStreamReader):
    """The Kafka stream reader, reading offsets below the archive's end from the archive."""

    def __init__(self, options: TieredOptions) -> None:
        super().__init__(options)
        self._tiered = options

    def __getstate__(self) -> dict[str, Any]:
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._tiered = state["_options"]

    def _client(self) -> KafkaAdmin:
        if self._admin is None:
            self._admin = TieredAdmin(self._tiered)
        return self._admin

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """The Kafka source's ranges, each told where the archive ends and which files to read."""
        planned = super().partitions(start, end)
        if not planned:
            return planned
        admin = self._client()
        assert isinstance(admin, TieredAdmin)
        coverage = admin.coverage(fresh=True)
        out: list[InputPartition] = []
        for p in planned:
            # Reading through the archive never packs ranges (inorder.rangeGroups needs
            # rangesOnly, which the runner does not set with an archive).
            assert isinstance(p, KafkaInputPartition)
            tp = TopicPartition(p.topic, p.partition)
            archive_end, files = plan_tiered(coverage, tp, p.start, p.end)
            out.append(
                TieredInputPartition(p.topic, p.partition, p.start, p.end, archive_end, files)
            )
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Records of one range in offset order: archive first, then Kafka."""
        assert isinstance(partition, KafkaInputPartition)
        tp = TopicPartition(partition.topic, partition.partition)
        if not isinstance(partition, TieredInputPartition):
            yield from read_range(self._tiered, tp, partition.start, partition.end)
            return
        yield from read_tiered_range(
            self._tiered,
            tp,
            partition.start,
            partition.end,
            archive_end=partition.archive_end,
            files=partition.files,
        )


class TieredDataSource(DataSource):
    """``spark.readStream.format("inorder-tiered")``: archive, then Kafka, per partition."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return SOURCE_NAME

    def schema(self) -> str:
        """The Kafka source's columns; options are validated here so ``load()`` fails early."""
        parse_tiered_options(dict(self.options))
        return KAFKA_SPARK_DDL

    def streamReader(self, schema: Any) -> TieredStreamReader:
        """The micro-batch reader."""
        return TieredStreamReader(parse_tiered_options(dict(self.options)))


def tiered_load_options(archive: str, storage: Mapping[str, str] | None) -> dict[str, str]:
    """The extra options turning ``inorder-kafka`` options into ``inorder-tiered`` ones."""
    out = {ARCHIVE_OPTION: archive}
    if storage:
        out[ARCHIVE_STORAGE_OPTION] = json.dumps(dict(storage))
    return out


@dataclass(frozen=True, repr=False)
class TieredSource(KafkaSource):
    """A :class:`~inorder.kafka.api.KafkaSource` read from its archive up to the archive's
    end, then from Kafka (``archive`` is required; see docs/archive.md).

    A ``Pipeline`` whose ``KafkaSource`` names an archive reads it as one of these (it turns
    the source into one when it is built, :meth:`of`); the TOML ``archive`` setting comes the
    same way. It is the Kafka source's value with the archive's reading added, not a wrapper
    around one, so whatever treats a pipeline's source as that value keeps working unchanged:
    ``dataclasses.replace(source, starting_offsets=...)`` (where a repaired checkpoint or an
    initial state starts), the recorded identity (its Kafka options), the settings' type.
    """

    def __post_init__(self) -> None:
        if not self.archive:
            raise ConfigError("archive: required (the path of an `inorder archive` dataset)")

    @classmethod
    def of(cls, source: KafkaSource) -> TieredSource:
        """``source`` (naming its archive) as a tiered source."""
        if isinstance(source, TieredSource):
            return source
        return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(KafkaSource)})

    def __repr__(self) -> str:
        kafka = super().__repr__().removeprefix("KafkaSource(")[:-1]
        return f"TieredSource({kafka}, archive={self.archive!r})"

    @property
    def archive_path(self) -> str:
        """The archive's path (always set: checked when the source is made)."""
        return self.archive or ""

    @property
    def reads_archive(self) -> bool:
        """Always: the archive below its end, then Kafka."""
        return True

    def read_options(self) -> TieredOptions:
        """The Kafka options reading below Kafka from the archive (operations tools)."""
        return tiered_options_of(
            parse_options(self.to_options()), self.archive_path, self.archive_storage_options
        )

    def check(
        self, extra_options: Mapping[str, str] | None = None, *, bounded: bool = False
    ) -> list[str]:
        """The Kafka source's checks, then the archive's coverage is loaded (fails early)."""
        notes = super().check(extra_options, bounded=bounded)
        load_coverage(self.archive_path, dict(self.archive_storage_options) or None)
        return notes

    def load(self, spark: Any, extra_options: Mapping[str, str] | None = None) -> Any:
        """The streaming DataFrame of ``inorder-tiered`` (checks options and broker first)."""
        from inorder.spark.worker_pools import in_pool

        options = {**self.to_options(), **(extra_options or {})}
        self.check(extra_options)
        options.update(tiered_load_options(self.archive_path, self.archive_storage_options))
        with in_pool(spark, None):  # the source's reads: never the engine's worker pool
            spark.dataSource.register(TieredDataSource)
        return spark.readStream.format(TieredDataSource.name()).options(**options).load()
