#!/usr/bin/env bash
# Set everything up and run the main job on embedded defaults: a local Kafka-protocol broker,
# simulated collection sites, the session-table pipeline on local Spark until caught up, and
# a summary checked against the simulator's ground truth. Output lands in .inorder/demo/.
# Installs only what the demo runs: inorder and the local broker (`scripts/setup.sh demo`; the
# S3 server and the test tools come with `scripts/setup.sh dev-services` / `dev`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
VENV=${INORDER_VENV:-.venv}
export PYSPARK_PYTHON="$PWD/$VENV/bin/python" PYSPARK_DRIVER_PYTHON="$PWD/$VENV/bin/python"
exec "$VENV/bin/inorder" demo "$@"
