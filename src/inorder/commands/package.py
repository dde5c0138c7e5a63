"""``inorder package``: a relocatable environment archive for ``spark-submit --archives``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from inorder.commands.common import add_command

EXAMPLES = """examples:
  inorder package                                   dist/inorder-env.tar.gz + dist/inorder-submit.py
  inorder package --output /shared/inorder-env.tar.gz
  inorder package --python-prefix /usr/local        executors have python3.11 in /usr/local/bin

then (no JVM jars needed: the Kafka source is pure Python), from the pipeline's directory:
  mkdir -p env && tar -xzf dist/inorder-env.tar.gz -C env    # the driver uses it too
  spark-submit --master spark://127.0.0.1:7077 \\
    --archives dist/inorder-env.tar.gz#env \\
    --conf spark.pyspark.python=./env/bin/python \\
    dist/inorder-submit.py pipeline.toml
"""


def register(subparsers: Any) -> None:
    """Add the ``package`` command."""
    parser = add_command(
        subparsers,
        "package",
        help="build a Python environment archive for spark-submit --archives",
        description="Build inorder's wheel, install it with its dependencies (pinned to this "
        "environment's versions; pyspark and py4j left out, Spark ships them) into a fresh "
        "virtualenv, and pack that with venv-pack. Also writes the spark-submit entry script "
        "next to the archive.",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        default=Path("dist/inorder-env.tar.gz"),
        metavar="FILE",
        help="archive to write (default dist/inorder-env.tar.gz)",
    )
    parser.add_argument(
        "--project", type=Path, metavar="DIR", help="inorder source tree (default: found)"
    )
    parser.add_argument(
        "--python-prefix",
        metavar="DIR",
        help="prefix of python3.11 on the executors, e.g. /usr (default: this one's)",
    )
    parser.add_argument(
        "--include-pyspark",
        action="store_true",
        help="also pack pyspark and py4j (only for clusters without Spark's python libs)",
    )
    parser.add_argument(
        "--with",
        dest="extra",
        action="append",
        default=[],
        metavar="REQUIREMENT",
        help="also install this requirement, without its dependencies (list those too), "
        "e.g. --with ./my-processors; repeatable",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Build the archive and print where it is and how to submit with it."""
    from inorder.cluster.package import build_environment

    result = build_environment(
        args.output,
        project=args.project,
        include_pyspark=args.include_pyspark,
        python_prefix=args.python_prefix,
        extra_requirements=args.extra,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "archive": str(result.archive),
                    "entry_script": str(result.entry_script),
                    "wheel": result.wheel,
                    "distributions": result.distributions,
                    "excluded": result.excluded,
                    "size_bytes": result.size_bytes,
                    "seconds": round(result.seconds, 1),
                },
                indent=2,
            )
        )
        return 0
    size = result.size_bytes / 1e6
    print(f"archive      {result.archive}  ({size:.0f} MB, {len(result.distributions)} packages)")
    print(f"entry script {result.entry_script}")
    print(f"left out     {', '.join(result.excluded) or 'nothing'} (Spark provides them)")
    print("submit with (no JVM jars needed), from the pipeline's directory:")
    print(f"  mkdir -p env && tar -xzf {result.archive} -C env")
    print(
        f"  spark-submit --master spark://HOST:7077 --archives {result.archive}#env \\\n"
        "    --conf spark.pyspark.python=./env/bin/python \\\n"
        f"    {result.entry_script} pipeline.toml"
    )
    return 0
