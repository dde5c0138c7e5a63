"""scripts/setup.sh: Java 17 or 21, the set of extras, and its stamp logic.

Runs a copy of the script next to a copy of pyproject.toml, with a stub ``java`` (prints the
version asked for) and a stub virtualenv whose ``python`` records the pip commands it gets:
nothing is installed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Setup:
    """A sandbox for scripts/setup.sh."""

    def __init__(self, tmp: Path, java_version: str = "17.0.15") -> None:
        self.root = tmp / "repo"
        (self.root / "scripts").mkdir(parents=True)
        shutil.copy(ROOT / "scripts" / "setup.sh", self.root / "scripts" / "setup.sh")
        shutil.copy(ROOT / "pyproject.toml", self.root / "pyproject.toml")
        self.bin = tmp / "bin"
        self.bin.mkdir()
        self.java(java_version)
        self.venv = tmp / "venv"
        (self.venv / "bin").mkdir(parents=True)
        self.calls = tmp / "pip-calls"
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        self.python(self.venv / "bin" / "python", version, record=True)

    def python(self, path: Path, version: str, record: bool = False) -> None:
        """A stub interpreter: answers setup.sh's version question, records pip commands."""
        log = f'echo "$*" >> {self.calls}' if record else "true"
        path.write_text(f'#!/bin/sh\ncase "$1" in -c) echo {version} ;; *) {log} ;; esac\n')
        path.chmod(0o755)

    def java(self, version: str) -> None:
        stub = self.bin / "java"
        stub.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2025-04-15' >&2\n")
        stub.chmod(0o755)

    @property
    def stamp(self) -> Path:
        return self.venv / ".inorder-installed"

    def sha(self) -> str:
        return hashlib.sha256((self.root / "pyproject.toml").read_bytes()).hexdigest()

    def run(self, *args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
        env.update(
            PATH=f"{self.bin}{os.pathsep}{env['PATH']}",
            PYTHON=python,
            INORDER_VENV=str(self.venv),
            INORDER_BROWSER="0",
        )
        return subprocess.run(
            ["bash", str(self.root / "scripts" / "setup.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def installs(self) -> list[str]:
        if not self.calls.exists():
            return []
        lines = self.calls.read_text().splitlines()
        return [line.split()[-1] for line in lines if " -e " in line]


@pytest.mark.parametrize("version", ["17.0.15", "21.0.4"])
def test_java_17_and_21_are_accepted_and_named(tmp_path: Path, version: str) -> None:
    setup = Setup(tmp_path, version)
    done = setup.run("demo")
    assert done.returncode == 0, done.stderr
    assert f"using Java {version.split('.')[0]} at {setup.bin / 'java'}" in done.stderr


def test_an_unknown_set_is_refused(tmp_path: Path) -> None:
    done = Setup(tmp_path).run("everything")
    assert done.returncode == 2
    assert "unknown set 'everything': use demo, dev-services or dev" in done.stderr


def test_each_set_installs_its_extra_and_stamps_it(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    assert setup.run("demo").returncode == 0
    assert setup.installs() == [".[demo]"]
    assert setup.stamp.read_text().split() == ["demo", setup.sha()]
    # The same or a smaller set: nothing to do.
    again = setup.run("demo")
    assert again.returncode == 0 and "up to date" in again.stderr
    assert setup.installs() == [".[demo]"]
    # A larger set installs that one; the default is dev.
    assert setup.run("dev-services").returncode == 0
    assert setup.run().returncode == 0
    assert setup.installs() == [".[demo]", ".[dev-services]", ".[dev]"]
    assert setup.run("demo").returncode == 0
    assert setup.installs() == [".[demo]", ".[dev-services]", ".[dev]"]
    assert setup.stamp.read_text().split() == ["dev", setup.sha()]


def test_a_changed_pyproject_reinstalls_the_larger_set(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    setup.stamp.write_text(f"dev-services {setup.sha()}\n")
    with open(setup.root / "pyproject.toml", "a") as fh:
        fh.write("\n# changed\n")
    assert setup.run("demo").returncode == 0
    assert setup.installs() == [".[dev-services]"]
    assert setup.stamp.read_text().split() == ["dev-services", setup.sha()]


def test_a_stamp_of_the_previous_setup_counts_as_dev(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    setup.stamp.write_text(setup.sha() + "\n")  # the old stamp: the hash alone
    for wanted in ("demo", "dev"):
        done = setup.run(wanted)
        assert done.returncode == 0 and "up to date" in done.stderr, done.stderr
    assert setup.installs() == []


@pytest.mark.parametrize("version", ["3.10", "3.14", "2.7"])
def test_an_unsupported_python_is_refused_with_the_reason(tmp_path: Path, version: str) -> None:
    setup = Setup(tmp_path)
    other = tmp_path / "bin" / f"python{version}"
    setup.python(other, version)
    done = setup.run("demo", python=str(other))
    assert done.returncode == 1
    assert "inorder needs Python 3.11 to 3.13 (PySpark 4.3 needs 3.11 or newer)" in done.stderr
    assert setup.installs() == []


def test_a_venv_of_another_python_is_named_not_reused(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    other = tmp_path / "bin" / "python3.12"
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    setup.python(other, "3.12" if mine != "3.12" else "3.13")
    done = setup.run("demo", python=str(other))
    assert done.returncode == 1
    assert f"runs Python {mine}, not" in done.stderr and "remove" in done.stderr
