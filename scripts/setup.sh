#!/usr/bin/env bash
# Set up inorder in a virtualenv (.venv, or $INORDER_VENV) on Python 3.11 to 3.13 (the
# newest found, or $PYTHON): check Java, then install the package with one set of extras
# (each includes the one before):
#
#   bash scripts/setup.sh demo           inorder + the local Kafka broker `inorder demo` starts
#   bash scripts/setup.sh dev-services   + the local S3 server and the registry formats: all
#                                        that `inorder dev up` runs
#   bash scripts/setup.sh [dev]          + the test and check tools (the default; scripts/test.sh)
#   bash scripts/setup.sh --which-python   print the Python it would use, install nothing
#
# Spark 4 runs on Java 17 or 21: the one Spark will use ($JAVA_HOME, else `java` on PATH) must
# be one of them. When neither is installed and this runs as root with apt-get, Java 17 is
# installed; otherwise the script says what to do.
#
# Idempotent: a second run is a no-op unless pyproject.toml changed or a larger set is asked
# for than the one installed (the stamp $VENV/.inorder-installed records "<set> <sha256 of
# pyproject.toml>"). pip's wheel cache keeps the pyspark wheel it builds from the ~450 MB
# sdist, so repeat installs (even into a fresh .venv) take seconds, not minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

# Local runs start seconds sooner with a JVM class archive of Spark's classes and a Spark home
# whose Python processes import the compiled PySpark (`inorder prepare`: ~30 s once per
# Spark/Java install, then a no-op). An optimisation only: a failure is reported, not fatal.
# INORDER_PREPARE=0 skips it.
prepare_local_starts() {
  [ "${INORDER_PREPARE:-1}" = "0" ] && return 0
  "$VENV/bin/python" -m inorder.cli prepare >&2 ||
    log "warning: 'inorder prepare' failed: local runs start slower (run it to see why)"
}

# The status page's browser test (dev set) drives Debian's chromium through chromedriver. As
# root with apt-get they are installed; otherwise that one test is skipped, and this says so.
# INORDER_BROWSER=0 skips this step.
install_browser() {
  [ "$EXTRAS" = "dev" ] && [ "${INORDER_BROWSER:-1}" != "0" ] || return 0
  [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && return 0
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's chromium and chromium-driver (the status page's browser test)"
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq chromium chromium-driver >/dev/null; then
      return 0
    fi
  fi
  log "warning: no /usr/bin/chromium and /usr/bin/chromedriver: the browser test will be" \
    "skipped (apt-get install chromium chromium-driver)"
}

rank_of() {
  case "$1" in
    demo) echo 1 ;;
    dev-services) echo 2 ;;
    dev) echo 3 ;;
    *) echo 0 ;;
  esac
}

EXTRAS=${1:-dev}
case "$EXTRAS" in
  --which-python)
    WHICH_PYTHON=1
    EXTRAS=demo
    ;;
  -h | --help)
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
if [ "$(rank_of "$EXTRAS")" = 0 ]; then
  log "error: unknown set '$EXTRAS': use demo, dev-services or dev (see scripts/setup.sh --help)"
  exit 2
fi

VENV=${INORDER_VENV:-.venv}

# -- Python and the virtualenv ---------------------------------------------------------------

# Python 3.11 to 3.13 (PySpark 4.3.0 needs 3.11 or newer). $PYTHON when given; else the
# interpreter of an existing $VENV when supported; else the newest supported one found on
# PATH, in pyenv's versions or in /usr/bin, /usr/local/bin. As root with apt-get and none
# found, Debian's python3.11 is installed.
SUPPORTED_PYTHONS="3.13 3.12 3.11" # newest first

version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }

is_supported() {
  case " $SUPPORTED_PYTHONS " in
    *" $1 "*) [ -n "$1" ] ;;
    *) return 1 ;;
  esac
}

# The newest supported interpreter on this machine (empty if none).
find_python() {
  local v candidate pyenv_root
  pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for v in $SUPPORTED_PYTHONS; do
    for candidate in "$(command -v "python$v" 2>/dev/null || true)" \
      "$pyenv_root"/versions/"$v"*/bin/"python$v" /usr/local/bin/"python$v" /usr/bin/"python$v"; do
      [ -n "$candidate" ] && [ -x "$candidate" ] || continue
      if [ "$(version_of "$candidate")" = "$v" ]; then
        echo "$candidate"
        return
      fi
    done
  done
}

# INORDER_PYTHON_VERSION=3.x asks for that version only (scripts/test.sh's checks on the
# oldest and newest); when it is not on the machine the exit code is 3.
if [ -n "${INORDER_PYTHON_VERSION:-}" ]; then
  if ! is_supported "$INORDER_PYTHON_VERSION"; then
    log "error: INORDER_PYTHON_VERSION=$INORDER_PYTHON_VERSION: use one of $SUPPORTED_PYTHONS"
    exit 2
  fi
  SUPPORTED_PYTHONS=$INORDER_PYTHON_VERSION
fi

if [ -n "${PYTHON:-}" ]; then
  if ! is_supported "$(version_of "$PYTHON")"; then
    log "error: PYTHON=$PYTHON is $("$PYTHON" --version 2>&1 || echo 'not runnable');" \
      "inorder needs Python 3.11 to 3.13 (PySpark 4.3 needs 3.11 or newer)"
    exit 1
  fi
elif [ -x "$VENV/bin/python" ] && is_supported "$(version_of "$VENV/bin/python")"; then
  PYTHON="$VENV/bin/python"
else
  PYTHON=$(find_python)
  if [ -z "$PYTHON" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    log "no Python 3.11 to 3.13 found: installing Debian's python3.11 and python3.11-venv"
    apt-get update -qq && apt-get install -y -qq python3.11 python3.11-venv >/dev/null || true
    PYTHON=$(find_python)
  fi
  if [ -z "$PYTHON" ]; then
    if [ -n "${INORDER_PYTHON_VERSION:-}" ]; then
      log "Python $INORDER_PYTHON_VERSION is not installed on this machine"
      exit 3
    fi
    log "error: inorder needs Python 3.11 to 3.13 and none was found" \
      "(python3 is $(python3 --version 2>&1 || echo 'missing')); install one or set PYTHON=..."
    exit 1
  fi
fi
PYTHON_VERSION=$(version_of "$PYTHON")
if [ -x "$VENV/bin/python" ] && [ "$(version_of "$VENV/bin/python")" != "$PYTHON_VERSION" ]; then
  log "error: $VENV runs Python $(version_of "$VENV/bin/python"), not $PYTHON_VERSION" \
    "($PYTHON): remove $VENV or choose another with INORDER_VENV=..."
  exit 1
fi
log "using Python $PYTHON_VERSION ($PYTHON)"

# --which-python: print the interpreter this would use (INORDER_PYTHON_VERSION applies) and stop.
if [ "${WHICH_PYTHON:-0}" = "1" ]; then
  echo "$PYTHON"
  exit 0
fi

# -- Java ------------------------------------------------------------------------------------

# The java Spark starts: $JAVA_HOME/bin/java when JAVA_HOME is set, else the one on PATH.
java_bin() {
  if [ -n "${JAVA_HOME:-}" ]; then
    echo "$JAVA_HOME/bin/java"
  else
    command -v java 2>/dev/null || true
  fi
}

java_major() {
  "$1" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

# A Java 17 or 21 installed but not the one Spark would use (to suggest JAVA_HOME).
other_java() {
  local candidate
  for candidate in /usr/lib/jvm/*/bin/java /Library/Java/JavaVirtualMachines/*/Contents/Home/bin/java; do
    [ -x "$candidate" ] || continue
    case "$(java_major "$candidate")" in
      17 | 21) echo "${candidate%/bin/java}"; return ;;
    esac
  done
}

java_ok() {
  local bin
  bin=$(java_bin)
  [ -n "$bin" ] && [ -x "$bin" ] || return 1
  case "$(java_major "$bin")" in
    17 | 21) return 0 ;;
  esac
  return 1
}

describe_java() {
  local bin
  bin=$(java_bin)
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "none${JAVA_HOME:+ (JAVA_HOME=$JAVA_HOME has no bin/java)}"
  else
    echo "Java $(java_major "$bin") at $bin"
  fi
}

if ! java_ok; then
  if [ -z "$(other_java)" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    log "neither Java 17 nor 21 found ($(describe_java)): installing openjdk-17-jre-headless"
    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  fi
fi
if ! java_ok; then
  log "error: Spark 4 needs Java 17 or 21; the java Spark would start is: $(describe_java)."
  found=$(other_java)
  if [ -n "$found" ]; then
    log "Java $(java_major "$found/bin/java") is installed at $found: export JAVA_HOME=$found"
  else
    log "install one, e.g. 'sudo apt-get install openjdk-17-jre-headless', or set JAVA_HOME"
  fi
  exit 1
fi
log "using $(describe_java)"


stamp="$VENV/.inorder-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
have_set=""
have_sha=""
if [ -f "$stamp" ]; then
  read -r first second <"$stamp" || true
  if [ -z "${second:-}" ]; then
    have_set=dev # a stamp of an earlier setup.sh: it always installed the dev set
    have_sha=${first:-}
  else
    have_set=$first
    have_sha=$second
  fi
fi
if [ -x "$VENV/bin/python" ] && [ "$have_sha" = "$want" ] &&
  [ "$(rank_of "$have_set")" -ge "$(rank_of "$EXTRAS")" ]; then
  log "up to date: $VENV has inorder[$have_set]"
  install_browser
  prepare_local_starts
  exit 0
fi
if [ -x "$VENV/bin/python" ] && [ "$(rank_of "$have_set")" -gt "$(rank_of "$EXTRAS")" ]; then
  EXTRAS=$have_set # pyproject.toml changed: keep the larger set that is installed
fi
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
log "installing inorder[$EXTRAS] (first run builds the pyspark wheel: a few minutes)"
"$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
"$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
echo "$EXTRAS $want" >"$stamp"
install_browser
prepare_local_starts
log "ready: $VENV/bin/inorder (inorder[$EXTRAS])"
