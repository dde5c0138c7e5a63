"""``spark-submit`` entry script: run a pipeline file with the settings spark-submit was given.

Usage (client mode; ``inorder package`` writes a copy of this file as
``dist/inorder-submit.py``), from a directory where ``./env`` is the unpacked archive (the
driver starts the data source's Python planning processes with the same interpreter path
as the executors)::

    mkdir -p env && tar -xzf dist/inorder-env.tar.gz -C env
    spark-submit --master spark://127.0.0.1:7077 \\
      --archives dist/inorder-env.tar.gz#env \\
      --conf spark.pyspark.python=./env/bin/python \\
      dist/inorder-submit.py pipeline.toml [inorder run options...]

What spark-submit decided wins over the pipeline file: its ``--master`` replaces
``[spark] master``, and every ``spark.*`` setting it was given (``--conf``, ``--archives``,
the driver host...) is merged over ``[spark] conf``. Without that, the pipeline's session
builder would set its own one-machine defaults (driver on 127.0.0.1, ...) over them.
Everything else is ``inorder run``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

#: Settings not merged: the master goes through --master, the name is the pipeline's.
_NOT_MERGED = frozenset({"spark.master", "spark.app.name"})


def submitted_conf() -> dict[str, str]:
    """The Spark configuration spark-submit handed to this driver (empty outside it)."""
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext

    SparkContext._ensure_initialized()  # starts (or joins spark-submit's) JVM gateway
    return dict(SparkConf().getAll())


def run_args(argv: Sequence[str], conf: dict[str, str]) -> list[str]:
    """``inorder run`` arguments: the user's, plus spark-submit's master and driver address."""
    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: spark-submit ... inorder-submit.py PIPELINE.toml [run options]")
    args = ["run", *argv]
    if "--master" not in argv and conf.get("spark.master"):
        args += ["--master", conf["spark.master"]]
    overrides = {k: v for k, v in conf.items() if k.startswith("spark.") and k not in _NOT_MERGED}
    if overrides and argv[0].endswith(".toml"):
        args += ["--set", "spark.conf=" + _inline_table(_file_conf(argv[0]) | overrides)]
    return args


def _file_conf(path: str) -> dict[str, str]:
    import tomllib

    with open(path, "rb") as fh:
        conf = tomllib.load(fh).get("spark", {}).get("conf", {})
    return {str(k): str(v) for k, v in conf.items()}


def _inline_table(values: dict[str, str]) -> str:
    # JSON strings are valid TOML basic strings for the characters Spark settings use.
    return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in values.items()) + " }"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inorder run`` with spark-submit's settings; the exit code of the run."""
    from inorder.cli import main as cli_main

    args = list(sys.argv[1:] if argv is None else argv)
    return cli_main(run_args(args, submitted_conf()))


if __name__ == "__main__":
    sys.exit(main())
