"""Shared fixtures: one broker, one S3 server and one SparkSession per test session."""

pytest_plugins = ["tests.fixtures.services", "tests.fixtures.spark", "tests.fixtures.cluster"]
