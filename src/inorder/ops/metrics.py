"""A Prometheus endpoint for a running pipeline (prometheus-client).

:class:`MetricsExporter` is a :class:`~inorder.pipeline.observer.RunObserver`: it updates its
metrics after every micro-batch and serves them over HTTP (``/metrics``) on
``127.0.0.1:9108`` by default; binding another address is an explicit choice. Every metric
has a ``pipeline`` label.

=====================================  =========  ==============================================
metric                                 type       meaning
=====================================  =========  ==============================================
``inorder_up``                         gauge      1 while the query runs, 0 after failure/stop
``inorder_lag_records{partition}``     gauge      records behind the latest offset, per
                                                  ``topic[partition]``
``inorder_records_total``              counter    records processed
``inorder_records_per_second``         gauge      throughput of the last batch
``inorder_batch_duration_seconds``     histogram  micro-batch durations
``inorder_last_batch_duration_seconds``  gauge    duration of the last batch
``inorder_state_keys``                 gauge      keys holding state after the last batch
``inorder_output_rows_total``          counter    output rows committed
``inorder_violations_total{rule}``     counter    integrity events, by rule
``inorder_partition_violations_total``  counter   integrity events by ``partition``
``{partition,rule}``                              (``topic[partition]``) and rule
``inorder_last_committed_batch``       gauge      id of the last committed micro-batch
``inorder_batches_total``              counter    micro-batches finished
``inorder_failures_total``             counter    query failures
=====================================  =========  ==============================================
"""

from __future__ import annotations

from typing import Any

from inorder.pipeline.progress import BatchProgress

DEFAULT_PORT = 9108
DEFAULT_HOST = "127.0.0.1"


class MetricsExporter:
    """Serves a pipeline's metrics for Prometheus (see the module docs)."""

    def __init__(
        self, port: int = DEFAULT_PORT, host: str = DEFAULT_HOST, pipeline: str = "inorder"
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.host = host
        self.requested_port = port
        self.pipeline = pipeline
        # A registry per exporter: several pipelines (or tests) in one process never clash.
        self.registry = CollectorRegistry()
        r, lab = self.registry, ["pipeline"]
        self.up = Gauge("inorder_up", "1 while the query runs", lab, registry=r)
        self.lag = Gauge(
            "inorder_lag_records",
            "Records behind the latest offset",
            [*lab, "partition"],
            registry=r,
        )
        self.records = Counter("inorder_records", "Records processed", lab, registry=r)
        self.rate = Gauge(
            "inorder_records_per_second", "Throughput of the last batch", lab, registry=r
        )
        self.duration = Histogram(
            "inorder_batch_duration_seconds",
            "Micro-batch duration",
            lab,
            registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
        )
        self.last_duration = Gauge(
            "inorder_last_batch_duration_seconds", "Duration of the last batch", lab, registry=r
        )
        self.state_keys = Gauge("inorder_state_keys", "Keys holding state", lab, registry=r)
        self.output_rows = Counter("inorder_output_rows", "Output rows committed", lab, registry=r)
        self.violations = Counter(
            "inorder_violations", "Integrity events by rule", [*lab, "rule"], registry=r
        )
        self.partition_violations = Counter(
            "inorder_partition_violations",
            "Integrity events by topic-partition and rule",
            [*lab, "partition", "rule"],
            registry=r,
        )
        self.last_batch = Gauge(
            "inorder_last_committed_batch", "Last committed micro-batch id", lab, registry=r
        )
        self.batches = Counter("inorder_batches", "Micro-batches finished", lab, registry=r)
        self.failures = Counter("inorder_failures", "Query failures", lab, registry=r)
        self._server: Any = None
        self._thread: Any = None

    @property
    def port(self) -> int | None:
        """The bound port (useful with port 0), ``None`` before :meth:`on_start`."""
        return None if self._server is None else int(self._server.server_port)

    def on_start(self) -> None:
        """Start serving ``/metrics``."""
        from prometheus_client import start_http_server

        if self._server is None:
            self._server, self._thread = start_http_server(
                self.requested_port, addr=self.host, registry=self.registry
            )
        self.up.labels(self.pipeline).set(1)

    def on_batch(self, progress: BatchProgress, lag_by_partition: dict[str, int] | None) -> None:
        """Update the metrics from one finished batch."""
        p = self.pipeline
        if lag_by_partition is not None:
            for partition, lag in lag_by_partition.items():
                self.lag.labels(p, partition).set(lag)
        self.records.labels(p).inc(progress.records)
        self.rate.labels(p).set(progress.records_per_second)
        self.duration.labels(p).observe(progress.duration_seconds)
        self.last_duration.labels(p).set(progress.duration_seconds)
        self.state_keys.labels(p).set(progress.state_keys)
        self.output_rows.labels(p).inc(progress.output_rows)
        for rule, count in progress.violations.items():
            self.violations.labels(p, rule).inc(count)
        for partition, counts in progress.violations_by_partition.items():
            for rule, count in counts.items():
                self.partition_violations.labels(p, partition, rule).inc(count)
        self.batches.labels(p).inc()
        if progress.committed:
            self.last_batch.labels(p).set(progress.batch_id)

    def on_failure(self, error: BaseException) -> None:
        """Count the failure; the query is down."""
        self.failures.labels(self.pipeline).inc()
        self.up.labels(self.pipeline).set(0)

    def on_stop(self) -> None:
        """Stop serving."""
        self.up.labels(self.pipeline).set(0)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
