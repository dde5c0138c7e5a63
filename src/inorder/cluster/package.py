"""Build a relocatable Python environment archive for ``spark-submit --archives``.

Steps (:func:`build_environment`):

1. Build a wheel of inorder from the project (``pip wheel --no-deps``).
2. Create a fresh virtualenv and install into it the wheel plus every distribution it needs,
   pinned to the versions installed in *this* environment (the ones the tests ran with).
   ``pyspark`` and ``py4j`` are left out by default: Spark puts its own ``pyspark.zip`` and
   py4j on the Python workers' ``PYTHONPATH``, so the archive does not need 450 MB of Spark.
3. Pack it with ``venv-pack`` into a ``.tar.gz`` whose ``bin/python`` links to the base
   interpreter at ``python_prefix`` (default: this interpreter's prefix), and write the
   ``spark-submit`` entry script (:mod:`inorder.cluster.submit_main`) next to the archive.

Executors unpack the archive into their work directory (``--archives ...#env``) and run
``./env/bin/python``. The archive is relocatable to any path, but the machines must have
the same Python version at ``python_prefix`` (venv-pack links, it does not copy, the
interpreter), the same OS/CPU architecture and a compatible glibc (the wheels carry native code).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from inorder.errors import InorderError

#: Left out of the archive by default: Spark ships them to Python workers itself.
PROVIDED_BY_SPARK = frozenset({"pyspark", "py4j"})
ENTRY_SCRIPT_NAME = "inorder-submit.py"


class PackageError(InorderError):
    """The environment archive could not be built."""


@dataclass
class PackageResult:
    """What was built."""

    archive: Path
    entry_script: Path
    wheel: str
    distributions: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    size_bytes: int = 0
    seconds: float = 0.0


def project_root(start: Path | None = None) -> Path:
    """The directory with inorder's ``pyproject.toml`` (searched upwards from the package)."""
    here = start or Path(__file__).resolve()
    for parent in [here, *here.parents]:
        candidate = parent / "pyproject.toml"
        if candidate.is_file() and re.search(
            r'^name\s*=\s*"inorder"', candidate.read_text(encoding="utf-8"), re.M
        ):
            return parent
    raise PackageError(
        "inorder's source tree (pyproject.toml) not found: pass --project DIR of a checkout"
    )


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """``Requires-Dist`` of a wheel, without extras-only requirements."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta_name).decode("utf-8")
    reqs = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                reqs.append(req)
    return reqs


def pinned_closure(roots: list[Requirement], exclude: frozenset[str]) -> list[str]:
    """``name==version`` of every distribution the roots need, as installed here.

    Pinning to this environment's versions makes the archive hold exactly what was tested.
    """
    env = {"extra": ""}  # merged into the running interpreter's marker environment
    seen: dict[str, str] = {}
    todo = list(roots)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or name in exclude:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            raise PackageError(
                f"{req.name} (needed by inorder) is not installed in {sys.prefix}"
            ) from None
        seen[name] = f"{dist.metadata['Name']}=={dist.version}"
        for raw in dist.requires or []:
            try:
                sub = Requirement(raw)
            except InvalidRequirement:
                continue
            if sub.marker is None or sub.marker.evaluate(env):
                todo.append(sub)
    return sorted(seen.values(), key=str.lower)


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise PackageError(f"{what} failed: {' | '.join(tail)}")


def build_environment(
    output: Path,
    project: Path | None = None,
    include_pyspark: bool = False,
    python_prefix: str | None = None,
    extra_requirements: list[str] | None = None,
) -> PackageResult:
    """Build the archive at ``output`` (see the module docstring); return what was built."""
    try:
        import venv_pack  # type: ignore[import-untyped]
    except ImportError:
        raise PackageError("venv-pack is not installed: pip install venv-pack") from None
    started = time.monotonic()
    project = project or project_root()
    output = output.absolute()
    output.parent.mkdir(parents=True, exist_ok=True)
    exclude = frozenset() if include_pyspark else PROVIDED_BY_SPARK
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    with tempfile.TemporaryDirectory(prefix="inorder-package-") as tmp:
        work = Path(tmp)
        _run(
            [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work), str(project)],
            "building the inorder wheel",
        )
        wheel = next(work.glob("inorder-*.whl"))
        pins = pinned_closure(wheel_requirements(wheel), exclude)
        pins += extra_requirements or []
        env_dir = work / "env"
        _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], "creating a venv")
        env_python = str(env_dir / "bin" / "python")
        _run(
            [*pip, "--python", env_python, "install", "--no-deps", "--no-compile", *pins],
            "installing the runtime dependencies",
        )
        _run(
            [*pip, "--python", env_python, "install", "--no-deps", str(wheel)],
            "installing the inorder wheel",
        )
        if output.exists():
            output.unlink()
        venv_pack.pack(
            prefix=str(env_dir),
            output=str(output),
            python_prefix=python_prefix,
            verbose=False,
            force=True,
        )
        wheel_name = wheel.name
    entry = output.parent / ENTRY_SCRIPT_NAME
    shutil.copyfile(Path(__file__).with_name("submit_main.py"), entry)
    os.chmod(entry, 0o755)
    return PackageResult(
        archive=output,
        entry_script=entry,
        wheel=wheel_name,
        distributions=pins,
        excluded=sorted(exclude),
        size_bytes=output.stat().st_size,
        seconds=time.monotonic() - started,
    )
