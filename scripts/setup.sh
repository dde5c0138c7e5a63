#!/usr/bin/env bash
# Set up inorder's development environment: Java 17 check, a virtualenv in .venv with the
# package and its dev tools installed. Idempotent: a second run is a no-op unless
# pyproject.toml changed. pip's wheel cache keeps the pyspark wheel it builds from the ~450 MB
# sdist, so repeat installs (even into a fresh .venv) take seconds, not minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=${INORDER_VENV:-.venv}

log() { printf '[setup] %s\n' "$*" >&2; }

java_major() {
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" != "17" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    log "Java 17 not found: installing openjdk-17-jre-headless with apt-get"
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    log "error: Spark 4.3 needs Java 17 (found: $(java -version 2>&1 | head -1 || echo none))."
    log "install it, e.g. 'sudo apt-get install openjdk-17-jre-headless', or set JAVA_HOME"
    exit 1
  fi
fi

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || {
  log "error: inorder needs Python 3.11 (found $("$PYTHON" --version 2>&1)); set PYTHON=..."
  exit 1
}

stamp="$VENV/.inorder-installed"
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
log "installing inorder and its dependencies (first run builds the pyspark wheel: a few minutes)"
"$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
"$VENV/bin/python" -m pip install -q -e ".[dev]"
echo "$want" > "$stamp"
log "ready: $VENV/bin/inorder"
