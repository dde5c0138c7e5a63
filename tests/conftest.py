"""Shared fixtures: one broker, one S3 server and one SparkSession per test session; sink
locations on local disk and on S3."""

import faulthandler
import os
from pathlib import Path
from typing import IO

import pytest

pytest_plugins = ["tests.fixtures.services", "tests.fixtures.spark", "tests.fixtures.cluster"]
# Helpers that assert: failures show their values as in the tests themselves.
pytest.register_assert_rewrite("tests.fixtures.sessions_job", "tests.fixtures.sink_cases")


@pytest.fixture(params=["local", "s3"])
def sink_location(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[str, dict[str, str] | None]:
    """A fresh dataset location and its storage options, on local disk and on S3."""
    if request.param == "local":
        return str(tmp_path / "out"), None
    s3 = request.getfixturevalue("s3")
    return s3.new_prefix(), s3.storage_options()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tag the soak tests (marked ``slow``) in the JUnit report, so that
    ``scripts/test_times.py`` can total them."""
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.user_properties.append(("marker", "slow"))


#: Where a test process writes every thread's stack if it crashes inside a native library
#: (under the checkout's root).
CRASH_DIR = Path(".inorder", "crashes")
_CRASH_FILE = pytest.StashKey[IO[str]]()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Send a native crash's stacks (a segfault inside a library) to a file of this process.

    pytest prints them on stderr, in the middle of a long log that CI shows only in part;
    ``scripts/test.sh`` prints each file's crashing thread again at the end of the run.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    directory = config.rootpath / CRASH_DIR
    directory.mkdir(parents=True, exist_ok=True)
    crash_file = (directory / f"{worker}-{os.getpid()}.log").open("w")
    config.stash[_CRASH_FILE] = crash_file  # open for the life of the process
    faulthandler.enable(file=crash_file, all_threads=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    """A process that ended without a crash leaves no file behind."""
    crash_file = config.stash.get(_CRASH_FILE, None)
    if crash_file is None:
        return
    faulthandler.disable()
    crash_file.close()
    path = Path(crash_file.name)
    if path.stat().st_size == 0:
        path.unlink()
