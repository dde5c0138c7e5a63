"""A Spark home for local masters whose Python processes import PySpark's compiled modules.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the ``PYTHONPATH`` of every Python
process it starts: the worker daemon and, on the driver, one planner process per Python data
source step (lookup, create, plan, the streaming source runner). Python cannot cache bytecode
for modules imported from a zip, so each of them compiles PySpark from source: 0.6-0.7 s of
CPU per process against 0.13 s importing the installed package (measured here), about 2.5 s
of a local run's start-up, on its critical path.

When PySpark is pip-installed (its package directory holds ``bin`` and ``jars``) and the
workers run this interpreter (which imports that same PySpark), a local master is started
from a Spark home that links ``bin``, ``jars`` and ``sbin`` of the package and has no
``python`` directory: the processes then import the installed PySpark, with its ``.pyc``
files. An explicit ``SPARK_HOME`` is never replaced; ``INORDER_SPARK_HOME=off`` turns this off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

#: Environment variable: ``off`` keeps Spark's own home (with ``pyspark.zip``).
SWITCH_ENV = "INORDER_SPARK_HOME"
#: Environment variable: the cache directory (default ``$XDG_CACHE_HOME/inorder``).
CACHE_ENV = "INORDER_CACHE_DIR"
_LINKED = ("bin", "jars", "sbin")


def cache_dir() -> Path:
    """Where inorder keeps per-machine caches (Spark home, JVM class archive)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inorder"


def pyspark_dir() -> Path:
    """The installed PySpark package's directory."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _workers_run_this_python(conf: Mapping[str, str]) -> bool:
    python = conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or sys.executable
    return os.path.realpath(python) == os.path.realpath(sys.executable)


def use_compiled_pyspark(conf: Mapping[str, str]) -> Path | None:
    """Point ``SPARK_HOME`` at the zip-less home when that is safe; the home, or ``None``."""
    if os.environ.get("SPARK_HOME") or os.environ.get(SWITCH_ENV, "").lower() == "off":
        return None
    package = pyspark_dir()
    if not all((package / name).is_dir() for name in _LINKED[:2]):
        return None  # not a pip install: a Spark distribution has its own home
    if not _workers_run_this_python(conf):
        return None  # another interpreter may only find PySpark in the zip
    try:
        home = _home_for(package)
    except OSError as exc:
        log.debug("no compiled-PySpark Spark home (%s); using Spark's own", exc)
        return None
    os.environ["SPARK_HOME"] = str(home)
    return home


def _home_for(package: Path) -> Path:
    import pyspark

    digest = hashlib.sha256(str(package).encode()).hexdigest()[:12]
    home = cache_dir() / f"spark-home-{pyspark.__version__}-{digest}"
    names = [name for name in _LINKED if (package / name).is_dir()]
    if all((home / name).resolve() == package / name for name in names):
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=home.parent))
    for name in names:
        (staged / name).symlink_to(package / name, target_is_directory=True)
    try:
        os.rename(staged, home)  # whole or nothing; another process may have won the race
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)
        if not (home / "jars").is_dir():
            raise
    return home
