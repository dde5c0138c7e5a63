"""Building the SparkSession inorder runs on, with the settings its engine relies on."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def build_spark_session(
    master: str = "local[*]",
    app_name: str = "inorder",
    conf: Mapping[str, str] | None = None,
    local_dir: str | None = None,
) -> Any:
    """Create (or get) the SparkSession, with inorder's data source registered.

    Sets ``PYSPARK_PYTHON`` to this interpreter unless already set: workers that start another
    python (without pyarrow) fail with nothing but "Python worker failed to connect back".
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # Local runs listen on loopback only (and skip the "hostname resolves to a loopback
        # address" warning).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    log_config = Path(__file__).with_name("log4j2.properties")

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log_config}")
        .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile={log_config}")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.encodingFormat", "avro")
    )
    if local_dir:
        builder = builder.config("spark.local.dir", local_dir)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _register_sources(session)
    return session


def _register_sources(session: Any) -> None:
    try:
        from inorder.kafka.source import KafkaDataSource
    except ImportError:  # the source module is optional while the package is being built
        return
    session.dataSource.register(KafkaDataSource)
