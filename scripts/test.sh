#!/usr/bin/env bash
# Set up and run every check: ruff, mypy --strict on the package, and the pytest suite
# (against a real local broker, S3 server and Spark, all started by the test fixtures).
# The whole suite takes ~30 minutes on 2 cores (~10 of them without the soak tests marked
# slow: kill -9 loops, executor/worker loss, sink crash loops). INORDER_TEST_QUICK=1 skips
# those. Extra arguments go to pytest, e.g. scripts/test.sh tests/unit
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${INORDER_VENV:-.venv}
export PYSPARK_PYTHON="$PWD/$VENV/bin/python" PYSPARK_DRIVER_PYTHON="$PWD/$VENV/bin/python"

echo "== ruff"
"$VENV/bin/ruff" check src tests bench examples
"$VENV/bin/ruff" format --check src tests bench examples
echo "== mypy --strict (package)"
"$VENV/bin/mypy" --strict src/inorder
echo "== pytest"
set +e
markers=()
if [ "${INORDER_TEST_QUICK:-0}" = "1" ]; then
  markers=(-m "not slow")
fi
"$VENV/bin/python" -m pytest -p no:cacheprovider "${markers[@]}" "$@"
code=$?
set -e
if [ "$code" = "5" ]; then
  echo "error: no test ran" >&2
  exit 1
fi
exit "$code"
