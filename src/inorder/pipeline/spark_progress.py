"""Spark's streaming progress, folded with the backend's batch report into inorder's own
progress line (:class:`~inorder.pipeline.progress.BatchProgress`): lag, timings, counts."""

from __future__ import annotations

from typing import Any

from inorder.pipeline.progress import BatchProgress


def progress_dict(progress: Any) -> dict[str, Any]:
    """A ``StreamingQueryProgress`` (or its dict) as a plain dict."""
    raw = getattr(progress, "json", None)
    if callable(raw):
        import json

        loaded: dict[str, Any] = json.loads(raw())
        return loaded
    return dict(progress)


def lag_by_partition(progress: dict[str, Any]) -> dict[str, int] | None:
    """Records not yet read, by ``topic[partition]``, from the source's progress metrics."""
    from inorder.kafka.lag import lag_from_progress

    try:
        return {str(tp): int(n) for tp, n in lag_from_progress(progress).items()}
    except Exception:  # lag is informative: never fail a run over it
        return None


def _lag(progress: dict[str, Any]) -> int | None:
    by_partition = lag_by_partition(progress)
    return None if by_partition is None else sum(by_partition.values())


def batch_progress(batch_id: int, report: Any, progress: dict[str, Any]) -> BatchProgress:
    """Combine the backend's batch report with Spark's progress into a progress line."""
    duration = float(getattr(report, "duration_seconds", 0.0)) or (
        float(progress.get("durationMs", {}).get("triggerExecution", 0)) / 1000.0
    )
    records = int(getattr(report, "records", 0))
    return BatchProgress(
        batch_id=batch_id,
        records=records,
        records_per_second=records / duration if duration > 0 else 0.0,
        duration_seconds=duration,
        lag=_lag(progress),
        state_keys=int(getattr(report, "state_keys", 0)),
        output_rows=int(getattr(report, "output_rows", 0)),
        output_files=int(getattr(report, "output_files", 0)),
        violations=dict(getattr(report, "violations_by_rule", {}) or {}),
        committed=bool(getattr(report, "committed", True)),
        violations_by_partition={
            partition: dict(counts)
            for partition, counts in (getattr(report, "violations_by_partition", {}) or {}).items()
        },
        seconds=_seconds(report, progress),
    )


def _seconds(report: Any, progress: dict[str, Any]) -> dict[str, float]:
    seconds = {
        k: round(float(v), 4) for k, v in (getattr(report, "phase_seconds", {}) or {}).items()
    }
    for step, ms in (progress.get("durationMs") or {}).items():
        seconds[f"spark_{step}"] = float(ms) / 1000.0
    return seconds
