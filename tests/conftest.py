"""Shared fixtures: one broker, one S3 server and one SparkSession per test session; sink
locations on local disk and on S3."""

from pathlib import Path

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
