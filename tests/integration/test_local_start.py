"""Faster local starts: the zip-less Spark home and the JVM class archive (``inorder prepare``).

Against the shared local[2] session (its JVM maps the archive; its workers import the
installed PySpark) and, for the cases a shared JVM cannot show, a fresh JVM in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from inorder.pipeline import class_archive, spark_home
from inorder.pipeline.spark import LOCAL_JVM_OPTIONS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fresh cache directory; no SPARK_HOME or switches from the outer environment."""
    for name in ("SPARK_HOME", spark_home.SWITCH_ENV, class_archive.SWITCH_ENV):
        # setenv first: delenv of an unset name records nothing, and the code under test
        # sets SPARK_HOME itself; the teardown must restore the outer value (or its absence).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv(spark_home.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_spark_home_links_the_installed_pyspark(clean_env: Path) -> None:
    home = spark_home.use_compiled_pyspark({})
    assert home is not None and home.parent == clean_env
    assert os.environ["SPARK_HOME"] == str(home)
    package = spark_home.pyspark_dir()
    assert (home / "jars").resolve() == package / "jars"
    assert (home / "bin" / "spark-submit").is_file()
    assert not (home / "python").exists()  # no pyspark.zip for Spark to put on PYTHONPATH
    # Again (another process, a later run): the same directory, left as it was.
    os.environ.pop("SPARK_HOME")
    assert spark_home.use_compiled_pyspark({}) == home


def test_spark_home_is_left_alone_when_it_could_change_behaviour(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    assert spark_home.use_compiled_pyspark({}) is None
    assert os.environ["SPARK_HOME"] == "/opt/spark"
    monkeypatch.delenv("SPARK_HOME")
    # Workers on another interpreter may find PySpark only in Spark's zip.
    assert spark_home.use_compiled_pyspark({"spark.pyspark.python": "/usr/bin/python3"}) is None
    monkeypatch.setenv(spark_home.SWITCH_ENV, "off")
    assert spark_home.use_compiled_pyspark({}) is None
    assert "SPARK_HOME" not in os.environ
    assert not clean_env.exists()


def test_class_archive_options(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spark_home.use_compiled_pyspark({})
    assert class_archive.java_options(LOCAL_JVM_OPTIONS) == ""  # not built yet
    path = class_archive.archive_path(LOCAL_JVM_OPTIONS)
    assert path is not None and path.parent == clean_env / "jvm"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    options = class_archive.java_options(LOCAL_JVM_OPTIONS)
    assert f"-XX:SharedArchiveFile={path}" in options and "-Xlog:cds=off" in options
    # Another JVM option set (or another Spark home) is another archive.
    assert class_archive.archive_path(LOCAL_JVM_OPTIONS + " -Xmx1g") != path
    monkeypatch.setenv(class_archive.SWITCH_ENV, "off")
    assert class_archive.java_options(LOCAL_JVM_OPTIONS) == ""


def test_a_reinstalled_jar_is_another_archive(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM silently refuses an archive whose jars changed size or time (a venv made again
    at the same path): the key covers them, so the next `inorder prepare` builds a new one."""
    home = tmp_path / "home"
    (home / "jars").mkdir(parents=True)
    jar = home / "jars" / "spark-core.jar"
    jar.write_bytes(b"one")
    monkeypatch.setenv("SPARK_HOME", str(home))
    before = class_archive.archive_path(LOCAL_JVM_OPTIONS)
    assert class_archive.archive_path(LOCAL_JVM_OPTIONS) == before
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    assert class_archive.archive_path(LOCAL_JVM_OPTIONS) != before


def test_workers_import_the_installed_pyspark(spark: Any) -> None:
    if "SPARK_HOME" not in os.environ or spark_home.SWITCH_ENV in os.environ:
        pytest.skip("the session was started with another Spark home")

    def _pyspark_file(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyspark

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"file": pyspark.__file__}])

    rows = spark.range(2, numPartitions=2).mapInArrow(_pyspark_file, "file string").collect()
    files = {row["file"] for row in rows}
    assert files == {str(spark_home.pyspark_dir() / "__init__.py")}, files


def test_the_session_jvm_maps_the_class_archive(spark: Any) -> None:
    path = class_archive.archive_path(LOCAL_JVM_OPTIONS)
    if path is None or not path.is_file() or class_archive.SWITCH_ENV in os.environ:
        pytest.skip(f"no class archive {path} for this installation: `inorder prepare` builds it")
    jvm = spark.sparkContext._gateway.proc
    maps = Path(f"/proc/{jvm.pid}/maps").read_text()
    assert str(path) in maps, f"the JVM (pid {jvm.pid}) did not map {path}"


def test_a_broken_archive_is_ignored_quietly(clean_env: Path) -> None:
    """A truncated or foreign archive file must not stop a run nor print into its output."""
    spark_home.use_compiled_pyspark({})
    path = class_archive.archive_path(LOCAL_JVM_OPTIONS)
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an archive" * 1000)
    job = (
        "from inorder.pipeline.spark import build_spark_session\n"
        "s = build_spark_session(master='local[1]')\n"
        "print('rows', s.range(5).count())\n"
        "s.stop()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", job],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == ["rows 5"], done.stdout


def test_warming_workers_starts_the_daemon_beside_the_driver(spark: Any) -> None:
    import psutil

    from inorder.pipeline.spark import warm_python_workers
    from inorder.spark.worker_pools import ENGINE_POOL, POOL_ENV

    assert warm_python_workers(spark, "spark://elsewhere:7077") is None
    warm_up = warm_python_workers(spark, "local[2]", (None, ENGINE_POOL))
    assert warm_up is not None
    warm_up.join(timeout=120)
    assert not warm_up.is_alive() and warm_up.error is None, warm_up.error
    jvm = psutil.Process(spark.sparkContext._gateway.proc.pid)

    def command_line(process: Any) -> str:
        try:
            return " ".join(process.cmdline())
        except psutil.Error:  # exited, or a zombie not yet reaped, since the listing
            return ""

    daemons = [p for p in jvm.children(recursive=True) if "inorder.spark.daemon" in command_line(p)]
    assert daemons, "no Python worker daemon under the session's JVM"

    def pool(process: Any) -> str | None:
        try:
            return str(process.environ().get(POOL_ENV, ""))
        except psutil.Error:
            return None

    # One daemon per pool: the engine's functions run apart from the source's reads.
    assert {"", ENGINE_POOL} <= {pool(p) for p in daemons}, [pool(p) for p in daemons]
