"""How long ``inorder verify`` takes on a large Parquet output (synthetic, built here).

Run: ``.venv/bin/python bench/verify_scale.py [--rows 100_000_000] [--file-rows 100_000]
[--files-per-batch 4] [--sample 20] [--distinct] [--write-docs]``

The output is built the way the sink lays it out, without a pipeline: one data file of
``--file-rows`` session-like rows (``bench/verify_digest.py``'s shape) is written once and
hard-linked under every final name (so 100M rows cost one file's disk space), each batch
manifest lists ``--files-per-batch`` of them with their rows and digest, its ranges tile
four partitions, and a commit checkpoint folds all but the newest 100 batches, as a long
run's commit log would. Then ``verify`` runs in a fresh process (metadata + footers), once
more with ``--sample`` digests. Wall times, median of 3.

Hard links share one inode, so every footer after the first comes from the page cache.
``--distinct`` copies the file instead (use small ``--file-rows``: the disk holds every copy),
and, where this process may (root), drops the page cache before every verify: the footers are
then read from disk, file by file, as a first verify of a real output reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import header, table, write_section
from bench.verify_digest import make_table

from inorder.sinks.commit_checkpoint import write_checkpoint
from inorder.sinks.commit_log import COMMITS_DIR, final_name, manifest_name
from inorder.sinks.proof import format_digest, table_digest
from inorder.storage import fs as sfs

PARTITIONS = ["site-a/0", "site-a/1", "site-b/0", "site-b/1"]


def build(root: Path, rows: int, file_rows: int, per_batch: int, distinct: bool = False) -> int:
    """Write the synthetic output under ``root``; returns the number of batches."""
    data = make_table(file_rows).drop_columns(["topic"])
    digest = format_digest(table_digest(data))
    source = root / "_source.parquet"
    (root / COMMITS_DIR).mkdir(parents=True)
    pq.write_table(data, source, compression="zstd")
    size = source.stat().st_size
    files = rows // file_rows
    batches = -(-files // per_batch)
    step = file_rows * per_batch // len(PARTITIONS)
    for b in range(batches):
        entries = []
        for n in range(min(per_batch, files - b * per_batch)):
            topic = "site-a" if n % 2 == 0 else "site-b"
            final = final_name(f"topic={topic}", b, n)
            (root / final).parent.mkdir(parents=True, exist_ok=True)
            if distinct:
                shutil.copyfile(source, root / final)
            else:
                os.link(source, root / final)
            entries.append(
                {
                    "staged": final,
                    "final": final,
                    "rows": file_rows,
                    "size_bytes": size,
                    "partition_values": {"topic": topic},
                    "digest": digest,
                }
            )
        manifest = {
            "format": 1,
            "kind": "batch",
            "batch_id": b,
            "created_at": time.time(),
            "partition_by": ["topic"],
            "owner": "bench",
            "files": entries,
            "offsets": {p: [b * step, (b + 1) * step] for p in PARTITIONS},
        }
        (root / COMMITS_DIR / manifest_name(b)).write_text(json.dumps(manifest))
        (root / COMMITS_DIR / manifest_name(b).replace(".json", ".done")).write_text("{}")
        if b == batches - 101:
            write_checkpoint(sfs.resolve(str(root)), manifest_retention=1)
    source.unlink()  # the links keep the data
    return batches


def timed_verify(root: Path, *extra: str, cold: bool = False) -> tuple[float, dict[str, object]]:
    """``verify`` of ``root`` in a fresh process (``cold``: the page cache dropped first):
    wall seconds and the report."""
    code = (
        "import json, sys\n"
        "from inorder.sinks.parquet import ParquetSink\n"
        "from inorder.ops.verify import verify\n"
        f"r = verify(ParquetSink({str(root)!r}, partition_by=['topic']), 'bench', "
        f"sample={int(extra[0]) if extra else 0})\n"
        "print(json.dumps(r.to_json()))\n"
    )
    if cold:
        drop_page_cache()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return time.perf_counter() - started, json.loads(done.stdout)


def drop_page_cache() -> bool:
    """Write back and drop the kernel's page cache; ``False`` where not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as knob:
            knob.write("3\n")
    except OSError:
        return False
    return True


def main() -> None:
    """Build, verify, print (and with ``--write-docs`` record) the times."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--file-rows", type=int, default=100_000)
    parser.add_argument("--files-per-batch", type=int, default=4)
    parser.add_argument("--sample", type=int, default=20)
    parser.add_argument("--distinct", action="store_true", help="copies, not hard links")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    cold = args.distinct and drop_page_cache()  # False where this process may not
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "out"
        root.mkdir()
        started = time.perf_counter()
        batches = build(root, args.rows, args.file_rows, args.files_per_batch, args.distinct)
        built = time.perf_counter() - started
        plain = [timed_verify(root, cold=cold) for _ in range(3)]
        sampled = [timed_verify(root, str(args.sample), cold=cold) for _ in range(3)]
    report = plain[0][1]
    folded = " (all but the newest 100 folded into a commit checkpoint)" if batches > 100 else ""
    assert report["ok"] is True, report["problems"]
    rows = [
        ["metadata + footers", f"{statistics.median(t for t, _ in plain):.1f}"],
        [
            f"+ digests of {args.sample} files ({args.sample * args.file_rows:,} rows)",
            f"{statistics.median(t for t, _ in sampled):.1f}",
        ],
    ]
    text = "\n".join(
        [
            "## inorder verify at scale",
            "",
            header(
                f"bench/verify_scale.py --rows {args.rows} --file-rows {args.file_rows} "
                f"--files-per-batch {args.files_per_batch} --sample {args.sample}"
                + (" --distinct" if args.distinct else "")
            ),
            "",
            f"A synthetic Parquet output of {report['rows']:,} rows in {report['files']:,} "
            f"{'distinct' if args.distinct else 'hard-linked'} files, {batches:,} "
            f"batches{folded}, four partitions; built in {built:.0f} s. `verify` in a fresh "
            "process (imports included"
            + ("; the page cache dropped before each" if cold else "")
            + "), wall seconds, median of 3:",
            "",
            table(["check", "s"], rows, right=(1,)),
            "",
            "Without digests the cost is one footer read per live file and the commit log: it "
            "grows with the number of files, not of rows. Full digests (`--digests`) read every "
            "row once, at the rate of the digest section below.",
        ]
    )
    print(text)
    if args.write_docs:
        write_section("## inorder verify at scale", text)


if __name__ == "__main__":
    main()
