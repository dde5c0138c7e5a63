#!/usr/bin/env bash
# Set up and run every check: ruff, mypy --strict on the package, and the pytest suite
# (against a real local broker, S3 server and Spark, all started by the test fixtures).
# The whole suite's pytest part takes ~23 minutes on a quiet 2-core machine in two processes
# (~42 in one: INORDER_TEST_WORKERS=1), less without the soak tests marked slow (kill -9
# loops, executor/worker loss, sink crash loops). INORDER_TEST_QUICK=1 skips
# those. Then the unit suite and one end-to-end run on the oldest and newest supported Python
# that the whole suite did not use (INORDER_TEST_OTHER_PYTHONS=0 skips them). Extra arguments
# go to pytest and run that subset only, e.g. scripts/test.sh tests/unit
#
# Inner loop: `scripts/test.sh --changed [BASE]` runs, without the soak tests, only the test
# files that cover the files changed since BASE (default HEAD: uncommitted and untracked
# changes), as scripts/changed_tests.py selects them; nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
changed=0
if [ "${1:-}" = "--changed" ]; then
  changed=1
  shift
  base=${1:-HEAD}
  [ "$#" -gt 0 ] && shift
fi
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
if [ "${INORDER_TEST_QUICK:-0}" = "1" ] || [ "$changed" = "1" ]; then
  markers=(-m "not slow")
fi
if [ "$changed" = "1" ]; then
  mapfile -t selected < <("$VENV/bin/python" scripts/changed_tests.py "$base")
  if [ "${#selected[@]}" = "0" ]; then
    echo "== no test covers the files changed since $base"
    exit 0
  fi
  echo "== ${#selected[@]} test file(s) cover the files changed since $base"
  set -- "${selected[@]}" "$@"
fi
# Every test's time goes to .inorder/test-times.xml (JUnit XML): `python scripts/test_times.py`
# turns it into the time table of tests/README.md.
mkdir -p .inorder
# A test process that crashes inside a native library leaves its threads' stacks here
# (tests/conftest.py); they are printed again after the run, where a cut log still shows them.
rm -rf .inorder/crashes
# INORDER_TEST_WORKERS=N runs the test files in N processes (pytest-xdist, a file's tests kept
# together so module fixtures are paid once); each process starts its own broker, S3 server
# and JVM. Default: 2 for the whole suite (its runs beside two busy loops on 2 cores are in
# tests/README.md), 1 for a chosen subset; 1 is one process.
default_workers=2
[ "$#" = "0" ] || default_workers=1
workers=()
if [ "${INORDER_TEST_WORKERS:-$default_workers}" != "1" ]; then
  # pytest-xdist runs the test that crashed a process again in its replacement: two
  # replacements at most, so a test that crashes every time ends the run, not loops in it.
  workers=(-n "${INORDER_TEST_WORKERS:-$default_workers}" --dist loadfile --max-worker-restart 2)
fi
"$VENV/bin/python" -m pytest -p no:cacheprovider --durations=20 \
  --junitxml=.inorder/test-times.xml "${workers[@]}" "${markers[@]}" "$@"
code=$?
set -e
for crash in .inorder/crashes/*.log; do
  [ -s "$crash" ] || continue
  echo "== a test process crashed ($crash): the thread that crashed"
  grep -A 40 "^Current thread" "$crash" || head -60 "$crash"
done
if [ "$code" = "5" ]; then
  echo "error: no test ran" >&2
  exit 1
fi
[ "$code" = "0" ] || exit "$code"
[ "$#" = "0" ] || exit 0 # a chosen subset: the other Pythons are not part of it

# The built wheel, installed by pip into a clean Python 3.12 virtualenv (not this checkout's
# editable install), runs `inorder demo`: what a user who pip-installs inorder gets.
# INORDER_TEST_WHEEL=0 skips this.
if [ "${INORDER_TEST_WHEEL:-1}" != "0" ]; then
  echo "== the built wheel in a clean Python 3.12 virtualenv: inorder demo"
  set +e
  py312=$(INORDER_PYTHON_VERSION=3.12 INORDER_VENV=/nonexistent bash scripts/setup.sh --which-python)
  found=$?
  set -e
  if [ "$found" = "3" ]; then
    echo "== Python 3.12 is not installed on this machine: the wheel check is SKIPPED"
  elif [ "$found" != "0" ]; then
    exit "$found"
  else
    wheel_dir=$(mktemp -d)
    "$VENV/bin/python" -m pip wheel -q --no-deps -w "$wheel_dir/dist" .
    "$py312" -m venv "$wheel_dir/venv"
    "$wheel_dir/venv/bin/python" -m pip install -q "$(ls "$wheel_dir"/dist/inorder-*.whl)[demo]"
    (cd "$wheel_dir" && PYSPARK_PYTHON="$wheel_dir/venv/bin/python" \
      PYSPARK_DRIVER_PYTHON="$wheel_dir/venv/bin/python" "$wheel_dir/venv/bin/inorder" demo)
    rm -rf "$wheel_dir"
  fi
fi

# The oldest and newest supported Python (whichever the whole suite did not run on): the unit
# suite and one real-broker, real-Spark end-to-end run, each in its own virtualenv.
# INORDER_TEST_OTHER_PYTHONS=0 skips this.
[ "${INORDER_TEST_OTHER_PYTHONS:-1}" = "0" ] && exit 0
main_version=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
for version in 3.11 3.13; do
  [ "$version" = "$main_version" ] && continue
  other_venv=".venv-py$version"
  echo "== Python $version: unit suite and one end-to-end run ($other_venv)"
  set +e
  INORDER_PYTHON_VERSION=$version INORDER_VENV=$other_venv INORDER_PREPARE=0 bash scripts/setup.sh dev
  setup_code=$?
  set -e
  if [ "$setup_code" = "3" ]; then
    echo "== Python $version: not installed on this machine: its check is SKIPPED"
    continue
  fi
  [ "$setup_code" = "0" ] || exit "$setup_code"
  PYSPARK_PYTHON="$PWD/$other_venv/bin/python" PYSPARK_DRIVER_PYTHON="$PWD/$other_venv/bin/python" \
    "$other_venv/bin/python" -m pytest -p no:cacheprovider -q tests/unit \
    "tests/e2e/test_sessions_pipeline.py::test_session_tables_match_truth_with_late_site_and_faults"
done
