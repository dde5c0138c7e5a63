#!/usr/bin/env bash
# Run a command while CPU-bound processes keep every core busy: the machine a CI runner or a
# shared developer box is on a bad day. Tests must pass like this (they wait for events, not
# for seconds). stress-ng is used when installed (Debian: apt-get install stress-ng), else
# one Python busy loop per core; either way the load stops when the command ends.
#
#   bash scripts/under-load.sh bash scripts/test.sh            # the whole suite, loaded
#   INORDER_LOAD_WORKERS=4 bash scripts/under-load.sh bash scripts/test.sh tests/e2e
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: scripts/under-load.sh COMMAND [ARGS...]" >&2; exit 2; }
workers=${INORDER_LOAD_WORKERS:-$(nproc)}
pids=()
stop_load() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
}
trap stop_load EXIT
if command -v stress-ng >/dev/null 2>&1; then
  stress-ng --cpu "$workers" --quiet &
  pids+=("$!")
  echo "== under load: stress-ng --cpu $workers" >&2
else
  for _ in $(seq "$workers"); do
    python3 -c 'while True: pass' &
    pids+=("$!")
  done
  echo "== under load: $workers Python busy loops" >&2
fi
set +e
"$@"
code=$?
set -e
exit "$code"
