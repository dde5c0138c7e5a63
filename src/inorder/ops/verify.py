"""``inorder verify``: prove exactly-once from commit metadata and file footers, without Kafka.

Every batch commit records its proof (:mod:`inorder.sinks.proof`): the ``[start, end)`` it
consumed per partition, and each file's rows and digest. A backend module collects them into
:class:`Evidence` (:mod:`inorder.ops.verify_parquet` for Parquet datasets,
:mod:`inorder.ops.verify_tables` for Delta and Iceberg tables); this module judges it:

* the ranges of successive batches tile each partition from its first range to the
  committed end: no gap, no overlap, no range committed twice;
* every live file (what a reader of the documented layout reads) exists, and its footer's
  row count is the recorded one; with ``digests`` its rows hash to the recorded digest;
* no file is named by two batches, and nothing a listing reader sees is uncommitted
  (the backends report those).

Each problem is one line naming the batch, the partition and the file it concerns.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from inorder.ops.verify_evidence import BatchProof, Evidence, FileProof, Problem
from inorder.sinks.commit_log import is_not_found
from inorder.sinks.proof import add_digests, format_digest, table_digest
from inorder.storage import fs as sfs

__all__ = ["BatchProof", "Evidence", "FileProof", "Problem", "VerifyReport", "verify"]

#: Footers (and digests) read at a time: object stores answer many small reads in parallel.
READERS = 8


@dataclass
class VerifyReport:
    """The verdict: problems (none: the proof holds), what was covered, notes."""

    describe: str
    kind: str
    batches: int
    files: int
    rows: int
    digests_checked: int
    partitions: dict[str, list[int]]
    """Per partition, the ``[first start, last end)`` the batches cover."""
    problems: list[Problem]
    notes: list[str]
    live_files: list[FileProof] = field(default_factory=list)
    """The live files checked (not in the JSON report: it would grow with the output)."""
    evidence_batches: list[BatchProof] = field(default_factory=list)
    """The batch commits read (not folded ones; not in the JSON report either)."""

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems

    def lines(self) -> list[str]:
        """The human report: one line per problem, then a summary."""
        out = [p.line() for p in self.problems]
        out += [f"NOTE    {n}" for n in self.notes]
        covered = ", ".join(f"{tp} [{a}, {b})" for tp, (a, b) in sorted(self.partitions.items()))
        out.append(
            f"{self.describe}: {self.batches:,} batch(es), {self.files:,} live file(s), "
            f"{self.rows:,} row(s), {self.digests_checked:,} digest(s) checked; "
            f"ranges {covered or 'none recorded'}"
        )
        verdict = "the commit proofs hold" if self.ok else f"{len(self.problems)} problem(s)"
        out.append(verdict)
        return out

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (``--json``)."""
        return {
            "ok": self.ok,
            "output": self.describe,
            "kind": self.kind,
            "batches": self.batches,
            "files": self.files,
            "rows": self.rows,
            "digests_checked": self.digests_checked,
            "partitions": self.partitions,
            "problems": [p.to_json() for p in self.problems],
            "notes": self.notes,
        }


def check_ranges(
    evidence: Evidence, end: CheckpointEnd | None = None
) -> tuple[list[Problem], dict[str, list[int]]]:
    """Gaps, overlaps and ranges committed twice; the span covered per partition.

    Tiling starts after the last batch whose commit recorded no ranges (commits of a
    release without proofs come first): before it there is nothing to check against.
    A checkpoint made by ``inorder repair`` (``end.restarts``) moves where a partition's
    first range from ``end.restart_batch`` on must start: where the repair cut it.
    """
    problems: list[Problem] = []
    batches = evidence.batches
    bare = [i for i, b in enumerate(batches) if b.offsets is None]
    if bare:
        evidence.notes.append(
            f"{len(bare)} batch(es) recorded no offset ranges (committed by a release before "
            "commits carried proofs, or outside a pipeline); ranges are checked after "
            f"batch {batches[bare[-1]].batch_id}"
        )
        batches = batches[bare[-1] + 1 :]
    ranges: dict[str, list[tuple[int | None, int, int]]] = {}
    if not bare:
        for name, pieces in evidence.folded.items():
            ranges[name] = [(None, int(a), int(b)) for a, b in pieces]
    for b in batches:
        for name, (first, last) in (b.offsets or {}).items():
            ranges.setdefault(name, []).append((b.batch_id, first, last))
    covered: dict[str, list[int]] = {}
    for name, seq in sorted(ranges.items()):
        covered[name] = [min(r[1] for r in seq), max(r[2] for r in seq)]
        first_of: dict[tuple[int, int], int | None] = {(seq[0][1], seq[0][2]): seq[0][0]}
        cut = _cut(end, name)
        for (pb, ps, pe), (bid, start, stop) in itertools.pairwise(seq):
            if cut is not None and _after_cut(cut[0], pb, bid, start, cut[1]):
                # The repair deleted the rows from the cut on: tiling resumes there.
                pe, cut = min(pe, cut[1]), None
                first_of = {k: v for k, v in first_of.items() if k[1] <= pe}
            again = (start, stop) in first_of and start < stop
            if again and (start, stop) != (ps, pe):
                # The same range again, later: the batch's records were committed twice.
                pb, ps, pe = first_of[(start, stop)], start, stop
            first_of.setdefault((start, stop), bid)
            problems.extend(_pair(name, pb, ps, pe, bid, start, stop, evidence.folded_upto))
    return problems, covered


def _cut(end: CheckpointEnd | None, name: str) -> tuple[int, int] | None:
    """``(first batch, offset)`` where a repair restarted partition ``name``, if one did."""
    if end is None or end.restart_batch is None or name not in end.restarts:
        return None
    return end.restart_batch, end.restarts[name]


def _after_cut(first: int, prev: int | None, batch: int | None, start: int, at: int) -> bool:
    """Whether this pair crosses the repair: the previous range is before the repaired
    checkpoint's first batch and this one is at or after it (folded ranges have no batch
    id: then the range must start where the repair cut)."""
    if batch is not None and prev is not None:
        return prev < first <= batch
    if batch is not None:
        return batch >= first and start == at
    return start == at


def _pair(
    name: str,
    prev_batch: int | None,
    prev_start: int,
    prev_end: int,
    batch: int | None,
    start: int,
    end: int,
    folded_upto: int | None,
) -> list[Problem]:
    def who(b: int | None) -> str:
        return f"batch {b}" if b is not None else f"the batches folded up to {folded_upto}"

    if end < start:
        return [Problem("bad_range", f"range [{start}, {end}) ends before it starts", batch, name)]
    if start == prev_end:
        return []
    if start > prev_end:
        return [
            Problem(
                "gap",
                f"offsets [{prev_end}, {start}) are in no batch: {who(prev_batch)} ended at "
                f"{prev_end}, this batch starts at {start}",
                batch,
                name,
            )
        ]
    if (start, end) == (prev_start, prev_end):
        return [
            Problem(
                "committed_twice",
                f"range [{start}, {end}) was committed by {who(prev_batch)} already",
                batch,
                name,
            )
        ]
    return [
        Problem(
            "overlap",
            f"range [{start}, {end}) overlaps {who(prev_batch)}'s [{prev_start}, {prev_end})",
            batch,
            name,
        )
    ]


def check_shared(batches: Iterable[BatchProof]) -> list[Problem]:
    """Files named by two batch commits (or twice by one)."""
    seen: dict[str, int] = {}
    problems: list[Problem] = []
    for b in batches:
        for f in b.files:
            if f.path in seen:
                problems.append(
                    Problem(
                        "shared_file",
                        f"also committed by batch {seen[f.path]}",
                        b.batch_id,
                        file=f.path,
                    )
                )
            else:
                seen[f.path] = b.batch_id
    return problems


def check_files(
    location: sfs.Location,
    files: Sequence[FileProof],
    digests: bool = False,
    sample: int = 0,
    seed: int = 0,
) -> tuple[list[Problem], int]:
    """Existence and footer row count of every file; digests of all (``digests``) or of
    ``sample`` files chosen at random. Returns the problems and how many digests were read."""
    with_digest = [f for f in files if f.digest is not None]
    if digests:
        hashed = {f.path for f in with_digest}
    else:
        chosen = random.Random(seed).sample(with_digest, min(sample, len(with_digest)))
        hashed = {f.path for f in chosen}

    def one(f: FileProof) -> list[Problem]:
        return _check_file(location, f, f.path in hashed)

    with ThreadPoolExecutor(READERS) as pool:
        found = [p for ps in pool.map(one, files) for p in ps]
    return found, len(hashed)


def _check_file(location: sfs.Location, f: FileProof, hash_rows: bool) -> list[Problem]:
    full = location.join(f.path)
    try:
        with location.filesystem.open_input_file(full) as handle:
            reader = pq.ParquetFile(handle)
            rows = reader.metadata.num_rows
            if rows != f.rows:
                return [
                    Problem(
                        "row_count",
                        f"the footer says {rows:,} rows, the commit recorded {f.rows:,}",
                        f.batch,
                        file=f.path,
                    )
                ]
            if not hash_rows:
                return []
            digest = 0
            for batch in reader.iter_batches(batch_size=65_536):
                digest = add_digests(digest, table_digest(batch))
    except OSError as exc:
        if is_not_found(exc):
            return [Problem("missing_file", "committed but absent", f.batch, file=f.path)]
        return [Problem("unreadable", f"cannot be read: {exc}", f.batch, file=f.path)]
    except Exception as exc:  # a corrupt footer, a file that is not Parquet
        return [Problem("unreadable", f"not a readable Parquet file: {exc}", f.batch, file=f.path)]
    if format_digest(digest) != f.digest:
        return [
            Problem(
                "digest",
                f"its rows hash to {format_digest(digest)}, the commit recorded {f.digest}: "
                "rows were altered, added or removed after the commit",
                f.batch,
                file=f.path,
            )
        ]
    return []


@dataclass(frozen=True)
class CheckpointEnd:
    """Where the pipeline checkpoint says the committed output ends."""

    batch: int
    """The output's batch id of the newest batch Spark recorded as committed."""
    ends: dict[str, int]
    """Per ``"<topic>/<partition>"``, the next offset to read after that batch."""
    restart_batch: int | None = None
    """The output's first batch of a checkpoint made by ``inorder repair`` (``None``: none)."""
    restarts: dict[str, int] = field(default_factory=dict)
    """Where that checkpoint restarted each partition: the repair deleted the rows from
    there, so the partition's next range starts there, inside an earlier batch's range."""


def checkpoint_end(target: Any) -> CheckpointEnd | None:
    """The newest committed batch of an :class:`~inorder.ops.target.OpsTarget`'s Spark
    commit log (``None`` without one). Spark records a batch as committed only after the
    sink committed it, so the output must hold at least that batch."""
    from inorder.ops.batchlog import load_batch_log

    entry = load_batch_log(target.layout).last_committed()
    if entry is None:
        return None
    ends = {f"{tp.topic}/{tp.partition}": int(e) for tp, e in entry.end.items()}
    info = target.layout.info()
    starting: dict[str, dict[str, int]] = {}
    if info is not None and info.batch_offset is not None:  # a checkpoint `inorder repair` made
        starting = info.starting_offsets or {}
    restarts = {
        f"{topic}/{part}": int(start)
        for topic, parts in starting.items()
        for part, start in parts.items()
    }
    restart_batch = target.batch_offset if restarts else None
    return CheckpointEnd(target.batch_offset + entry.batch_id, ends, restart_batch, restarts)


def check_end(
    evidence: Evidence, covered: dict[str, list[int]], end: CheckpointEnd
) -> list[Problem]:
    """The output reaches the checkpoint's committed end, and claims nothing beyond it."""
    ids = [b.batch_id for b in evidence.batches]
    if evidence.folded_upto is not None:
        ids.append(evidence.folded_upto)
    last = max(ids, default=None)
    if last is None or last < end.batch:
        newest = "none" if last is None else last
        short = [
            Problem(
                "missing_batch",
                f"offsets [{covered[name][1] if name in covered else '?'}, {ck}) are committed "
                f"in the pipeline checkpoint (up to batch {end.batch}) but in no batch of the "
                f"output (its newest is {newest})",
                end.batch,
                name,
            )
            for name, ck in sorted(end.ends.items())
            if name not in covered or covered[name][1] < ck
        ]
        return short or [
            Problem(
                "missing_batch",
                f"the pipeline checkpoint committed batch {end.batch}, the output's newest "
                f"batch is {newest}: the commits after it are lost",
                end.batch,
            )
        ]
    if last != end.batch:
        return []  # a batch committed to the output whose Spark commit was not written yet
    return [
        Problem(
            "beyond_checkpoint",
            f"the output's ranges reach offset {span[1]}, the checkpoint's batch {end.batch} "
            f"ended at {end.ends[name]}",
            end.batch,
            name,
        )
        for name, span in sorted(covered.items())
        if name in end.ends and span[1] > end.ends[name]
    ]


def judge(
    evidence: Evidence,
    digests: bool = False,
    sample: int = 0,
    end: CheckpointEnd | None = None,
    ranges: bool = True,
) -> VerifyReport:
    """Check ``evidence`` (ranges, shared files, every live file) into a report; with
    ``end``, also that the output reaches the pipeline checkpoint's committed end.
    ``ranges=False`` skips the offset ranges (a dead-letter output records none)."""
    problems = list(evidence.problems)
    covered: dict[str, list[int]] = {}
    if ranges:
        range_problems, covered = check_ranges(evidence, end)
        problems += range_problems
    if end is not None:
        problems += check_end(evidence, covered, end)
    problems += check_shared(evidence.batches)
    file_problems, hashed = check_files(evidence.location, evidence.live, digests, sample)
    problems += file_problems
    undigested = sum(1 for f in evidence.live if f.digest is None)
    if undigested and (digests or sample):
        evidence.notes.append(
            f"{undigested} live file(s) have no recorded digest (older commits): rows counted only"
        )
    return VerifyReport(
        describe=evidence.describe,
        kind=evidence.kind,
        batches=len(evidence.batches) + evidence.folded_batches,
        files=len(evidence.live),
        rows=sum(f.rows for f in evidence.live),
        digests_checked=hashed,
        partitions=covered,
        problems=problems,
        notes=evidence.notes,
        live_files=list(evidence.live),
        evidence_batches=list(evidence.batches),
    )


def verify(
    sink: Any,
    owner: str | None,
    digests: bool = False,
    sample: int = 0,
    collect: Callable[[Any, str | None], Evidence] | None = None,
    end: CheckpointEnd | None = None,
    ranges: bool = True,
) -> VerifyReport:
    """Verify the committed output of ``sink`` (bound to pipeline checkpoint ``owner``);
    ``end`` is where the checkpoint says the committed output ends (:func:`checkpoint_end`);
    ``ranges=False`` for an output whose commits record no offset ranges (dead letters)."""
    while hasattr(sink, "inner"):  # job versions and repaired batch ids wrap the real sink
        sink = sink.inner
    if collect is None:
        collect = collector(sink)
    return judge(collect(sink, owner), digests, sample, end, ranges)


def collector(sink: Any) -> Callable[[Any, str | None], Evidence]:
    """The evidence collector for ``sink``'s kind of output."""
    from inorder.ops.output import sink_kind

    kind = sink_kind(sink)
    if kind == "parquet":
        from inorder.ops.verify_parquet import collect_parquet

        return collect_parquet
    from inorder.ops.verify_tables import collect_delta, collect_iceberg

    return collect_delta if kind == "delta" else collect_iceberg
