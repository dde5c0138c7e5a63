"""The JVM class archive for local masters: Spark's classes mapped from one file, not re-parsed.

A local ``inorder run`` starts a JVM that loads and verifies some 15,000 classes from Spark's
jars before the first batch; on two cores that is about half of the JVM's start-up. Java's
class-data sharing (``-XX:SharedArchiveFile``) maps classes already parsed and verified by an
earlier run instead. Measured here (Spark 4.3, JDK 17, local[2]): session creation 4.2 s ->
2.1 s and the first Spark job 2.0 s -> 0.9 s of wall time (``docs/benchmarks.md``).

The archive is built once per machine and Spark/Java installation by ``inorder prepare``
(``scripts/setup.sh`` runs it): a short representative job (a Python streaming data source,
``mapInArrow``, ``foreachBatch``, a Parquet write) runs with ``-XX:ArchiveClassesAtExit``,
and the file is renamed into place only after its JVM has exited, so a half-written archive
is never used. Runs on a local master add the archive's options when the file exists; a file
that no longer matches the installation (another Spark or Java) is ignored by the JVM, which
then starts as it would without one. The archive lives under ``$INORDER_CACHE_DIR`` (default
``$XDG_CACHE_HOME/inorder`` or ``~/.cache/inorder``), named by a digest of the Java binary,
the PySpark version, the Spark home's jars and the JVM options, so an upgrade builds a new one.
``INORDER_CLASS_ARCHIVE=off`` turns it off.

Each archive (~180 MB) records the jars folder it was built for beside it (``<name>.jars``);
building one removes the archives whose folder is gone (a deleted virtualenv or checkout), so
the cache holds one archive per installation in use, not one per installation ever prepared.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from inorder.pipeline.spark_home import CACHE_ENV, cache_dir, pyspark_dir, use_compiled_pyspark

#: Environment variable: ``off`` disables the archive; any other value is ignored.
SWITCH_ENV = "INORDER_CLASS_ARCHIVE"
#: Set only in the process that builds the archive: where its JVM writes it at exit.
_DUMP_ENV = "INORDER_CLASS_ARCHIVE_DUMP"

# The JVM reports archive mismatches on stdout, which carries a run's progress lines.
_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def _java_binary() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def _jars_dir() -> Path:
    # The JVM checks the class path it was dumped with: the jars of the home in use.
    return Path(os.environ.get("SPARK_HOME") or pyspark_dir()) / "jars"


#: Beside each archive: the jars folder it was built for (one line).
JARS_SUFFIX = ".jars"


def prune_archives(folder: Path, keep: Path) -> list[Path]:
    """Remove the archives in ``folder`` (not ``keep``) whose recorded jars folder is gone,
    and build leftovers of a day ago; the paths removed. An archive without a record (built
    before records were kept) stays: nothing says it is unused."""
    removed: list[Path] = []
    for record in folder.glob(f"*.jsa{JARS_SUFFIX}"):
        archive = record.with_name(record.name.removesuffix(JARS_SUFFIX))
        if archive == keep:
            continue
        try:
            if Path(record.read_text(encoding="utf-8").strip()).is_dir():
                continue
            archive.unlink(missing_ok=True)
            record.unlink()
        except OSError:
            continue
        removed.append(archive)
    day_ago = time.time() - 86_400
    for staged in folder.glob("*.jsa.*.tmp"):
        try:
            if staged.stat().st_mtime < day_ago:
                staged.unlink()
                removed.append(staged)
        except OSError:
            continue
    return removed


def archive_path(jvm_options: str) -> Path | None:
    """The archive for this Java, this Spark and ``jvm_options``; ``None`` without a Java."""
    java = _java_binary()
    if java is None:
        return None
    import pyspark

    jars = _jars_dir()
    digest = hashlib.sha256()
    for part in (java, str(os.path.getmtime(java)), str(jars), pyspark.__version__, jvm_options):
        digest.update(part.encode() + b"\0")
    # The JVM refuses an archive whose jars changed size or time (a reinstall at the same
    # path): they are part of the key, so a reinstall gets a new archive, not a silent no-op.
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else ():
        stat = jar.stat()
        digest.update(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}".encode() + b"\0")
    return cache_dir() / "jvm" / f"spark-{pyspark.__version__}-{digest.hexdigest()[:16]}.jsa"


def java_options(jvm_options: str) -> str:
    """Extra driver JVM options for a local master: use the archive if it exists."""
    dump = os.environ.get(_DUMP_ENV)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump}"
    if os.environ.get(SWITCH_ENV, "").lower() == "off":
        return ""
    path = archive_path(jvm_options)
    # Spark splits extraJavaOptions on whitespace; a path with spaces cannot be passed.
    if path is None or not path.is_file() or any(c.isspace() for c in str(path)):
        return ""
    return f"-XX:SharedArchiveFile={path} {_QUIET}"


def build(jvm_options: str, *, rebuild: bool = False, timeout_s: float = 600.0) -> Path:
    """Build the archive (unless it exists and ``rebuild`` is false); its path.

    Raises :class:`RuntimeError` naming the cause when no Java is found or the job fails.
    """
    # The job's Spark home decides the class path the archive is checked against.
    use_compiled_pyspark({})
    path = archive_path(jvm_options)
    if path is None:
        raise RuntimeError("no Java found (JAVA_HOME or java on PATH): PySpark needs one")
    if path.is_file() and not rebuild:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RuntimeError(
            f"cannot create {path.parent} ({exc.strerror}); set {CACHE_ENV}"
        ) from None
    with tempfile.TemporaryDirectory(prefix="inorder-class-archive-") as work:
        partial = Path(work) / "spark.jsa"
        env = dict(os.environ, **{_DUMP_ENV: str(partial)})
        done = subprocess.run(
            [sys.executable, "-m", "inorder.pipeline.warm_up_job", work],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0 or not partial.is_file():
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-5:]
            raise RuntimeError(
                f"building the JVM class archive failed (exit {done.returncode}): "
                + " | ".join(tail)
            )
        # Same directory, then rename: readers see the whole file or none.
        staged = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        shutil.move(str(partial), staged)
        os.replace(staged, path)
    path.with_name(path.name + JARS_SUFFIX).write_text(f"{_jars_dir()}\n", encoding="utf-8")
    prune_archives(path.parent, keep=path)
    return path
