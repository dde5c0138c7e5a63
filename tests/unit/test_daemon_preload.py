"""The worker daemon's preparation: what it preloads per pool, and jars it takes off the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

PROBE = """
import json, sys
from inorder.spark import daemon
failed = daemon.preload_modules()
print(json.dumps({
    "failed": failed,
    "path": sys.path,
    "modules": sorted(m for m in ("pandas", "pyarrow.parquet", "rocksdict",
                                  "confluent_kafka", "inorder.engine.task",
                                  "inorder.kafka.source", "inorder.kafka.consumer")
                   if m in sys.modules),
}))
"""


def _probe(tmp_path: Path, pool: str | None) -> dict[str, object]:
    no_python = tmp_path / "spark-core_2.13-x.jar"
    with zipfile.ZipFile(no_python, "w") as jar:
        jar.writestr("org/apache/spark/SparkContext.class", b"\xca\xfe")
    with_python = tmp_path / "pyfiles.jar"
    with zipfile.ZipFile(with_python, "w") as jar:
        jar.writestr("shipped_module.py", "VALUE = 1\n")
    env = {k: v for k, v in os.environ.items() if k != "INORDER_WORKER_POOL"}
    if pool is not None:
        env["INORDER_WORKER_POOL"] = pool
    env["PYTHONPATH"] = os.pathsep.join(
        [str(no_python), str(with_python), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["jars"] = [str(no_python), str(with_python)]
    return result


def test_a_jar_without_python_leaves_the_path_and_one_with_python_stays(tmp_path: Path) -> None:
    result = _probe(tmp_path, None)
    no_python, with_python = result["jars"]  # type: ignore[misc]
    assert no_python not in result["path"]  # type: ignore[operator]
    assert with_python in result["path"]  # type: ignore[operator]
    assert result["failed"] == []


def test_the_source_pool_preloads_only_what_marker_reads_need(tmp_path: Path) -> None:
    engine = _probe(tmp_path, "engine")
    assert engine["modules"] == sorted(
        [
            "pandas",
            "pyarrow.parquet",
            "rocksdict",
            "confluent_kafka",
            "inorder.engine.task",
            "inorder.kafka.source",
            "inorder.kafka.consumer",
        ]
    )
    source = _probe(tmp_path, "source")
    assert source["modules"] == ["inorder.kafka.consumer", "inorder.kafka.source", "pandas"]
