#!/usr/bin/env bash
# Start/stop/check a Spark standalone cluster (1 master + N workers) on 127.0.0.1 from the
# pip-installed pyspark. A thin wrapper over `inorder cluster`:
#   scripts/standalone-cluster.sh up [--workers 2 --cores 1 --memory 1g --state-dir DIR]
#   scripts/standalone-cluster.sh status [--url]
#   scripts/standalone-cluster.sh down
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${INORDER_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
exec "$PYTHON" -m inorder.cli cluster "$@"
