"""Which pipeline a checkpoint belongs to, and the settings it ran with.

A checkpoint only makes sense for the pipeline that wrote it: its offsets are positions in
*that* subscription, its state was built by *that* processor, its batch ids number *that*
output's commits. A run therefore records the pipeline's identity in the checkpoint's info
file the first time and compares it on every later start:

- name, processor class, source subscription and output location must match (a difference
  is refused unless the operator accepts it with ``inorder run --accept-changes``);
- the output schema may only evolve compatibly (columns added as nullable, none removed or
  retyped); anything else is refused even when changes are accepted, because files with two
  schemas would mix in one dataset.

The effective settings (the TOML file and every ``--set`` override, secrets masked) are
recorded too, so ``inorder validate`` and ``inorder repair`` judge what ran, not what the
TOML file says now.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

# The info file's keys, named where earlier releases imported them from.
from inorder.checkpoint.info import IDENTITY_FIELD as IDENTITY_FIELD
from inorder.checkpoint.info import SETTINGS_FIELD as SETTINGS_FIELD
from inorder.checkpoint.info import CheckpointInfo
from inorder.errors import ConfigError, InorderError
from inorder.redaction import MASK, mask_secrets
from inorder.sinks.evolution import schema_change

if TYPE_CHECKING:
    from inorder.checkpoint.layout import CheckpointLayout


def _unwrap_sink(sink: Any) -> Any:
    # Job versions and repaired batch ids wrap the user's sink; the identity is the real one.
    while hasattr(sink, "inner"):
        sink = sink.inner
    return sink


def _output_of(sink: Any) -> str:
    inner = _unwrap_sink(sink)
    path = getattr(inner, "path", None)
    kind = type(inner).__name__
    return f"{kind} {path}" if path is not None else kind


def _subscription_of(source: Any) -> str:
    options = source.to_options()
    for key in ("subscribePattern", "subscribe", "assign"):
        if key in options:
            return f"{key}={options[key]}"
    return "unknown"


@dataclass(frozen=True)
class PipelineIdentity:
    """What ties a checkpoint to one pipeline (recorded in the checkpoint's info file)."""

    name: str
    processor: str
    subscription: str
    output: str
    output_schema: str
    """The output rows' Arrow schema, as base64 IPC (see :func:`schema_text`)."""
    processor_options: str = ""
    """The processor's options that change its output (``identity_options``), as JSON."""

    @classmethod
    def of(cls, pipeline: Any, output_schema: pa.Schema) -> PipelineIdentity:
        """The identity of ``pipeline`` whose output rows have ``output_schema``."""
        processor = type(pipeline.processor)
        return cls(
            name=str(pipeline.name),
            processor=f"{processor.__module__}:{processor.__qualname__}",
            subscription=_subscription_of(pipeline.source),
            output=_output_of(pipeline.sink),
            output_schema=schema_text(output_schema),
            processor_options=_options_text(pipeline.processor),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PipelineIdentity:
        """Inverse of :meth:`to_json` (missing fields read as empty: they are not compared)."""
        return cls(**{k: str(data.get(k, "")) for k in cls.__dataclass_fields__})

    def to_json(self) -> dict[str, str]:
        """A JSON-serialisable form."""
        return asdict(self)

    def differences(self, recorded: PipelineIdentity) -> list[str]:
        """Lines naming what differs from ``recorded`` (except the schema), empty if nothing."""
        lines = []
        for label, name in (
            ("pipeline name", "name"),
            ("processor", "processor"),
            ("source subscription", "subscription"),
            ("output", "output"),
            ("processor options", "processor_options"),
        ):
            old, new = getattr(recorded, name), getattr(self, name)
            if old and old != new:
                lines.append(f"{label}: checkpoint has {old!r}, this run has {new!r}")
        return lines


def _options_text(processor: Any) -> str:
    # Checkpoints written before options were recorded hold "": not compared, then recorded.
    options = processor.identity_options()
    return json.dumps(options, sort_keys=True) if options else ""


def schema_text(schema: pa.Schema) -> str:
    """An Arrow schema as base64 IPC, without metadata (stable across runs)."""
    return base64.b64encode(schema.remove_metadata().serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    """Inverse of :func:`schema_text`."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def schema_fingerprint(text: str) -> str:
    """A short fingerprint of a recorded schema, for messages."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class RecordedSettings:
    """The settings a run used: the pipeline file and its ``--set`` overrides (masked)."""

    source: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    effective: dict[str, Any] = field(default_factory=dict)
    recorded_at: str = ""

    @classmethod
    def of(
        cls,
        source: str,
        overrides: Mapping[str, Any] | None,
        effective: Mapping[str, Any] | None = None,
    ) -> RecordedSettings:
        """Settings to record, with every secret masked."""
        return cls(
            source=source,
            overrides={k: mask_secrets(v, k) for k, v in (overrides or {}).items()},
            effective=mask_secrets(dict(effective or {})),
            recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RecordedSettings | None:
        """The recorded settings of a checkpoint info file's field, if any."""
        if not data:
            return None
        return cls(
            source=str(data.get("source", "")),
            overrides=dict(data.get("overrides") or {}),
            effective=dict(data.get("effective") or {}),
            recorded_at=str(data.get("recorded_at", "")),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return asdict(self)

    def replayable_overrides(self) -> dict[str, Any]:
        """The overrides that can be applied again (masked secrets are left to the file)."""
        return {k: v for k, v in self.overrides.items() if not _holds_mask(v)}


def _holds_mask(value: Any) -> bool:
    if value == MASK:
        return True
    if isinstance(value, Mapping):
        return any(_holds_mask(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_mask(v) for v in value)
    return False


def check_identity(
    recorded: PipelineIdentity | None,
    current: PipelineIdentity,
    checkpoint: str,
    accept_changes: bool = False,
) -> list[str]:
    """Compare a run's identity with the checkpoint's; return notes, raise when refused.

    Raises :class:`~inorder.errors.ConfigError` naming every difference and how to proceed.
    Returns lines to show the operator (accepted changes, a compatible schema evolution).
    """
    if recorded is None:
        return []
    notes: list[str] = []
    differences = current.differences(recorded)
    if differences and not accept_changes:
        raise ConfigError(
            f"checkpoint {checkpoint} belongs to another pipeline or to an earlier form of "
            "this one: "
            + "; ".join(differences)
            + ". If this is a different pipeline, give it its own checkpoint (pipeline."
            "checkpoint) and output. If you changed this pipeline on purpose, run once with "
            "`inorder run ... --accept-changes` (Pipeline.run(accept_changes=True)) to record "
            "the change; to re-process from the start with the new form use a new checkpoint "
            "and output, or a new job_version (docs/versioned-jobs.md)"
        )
    notes.extend(f"accepted change: {line}" for line in differences)
    if recorded.output_schema and recorded.output_schema != current.output_schema:
        old = schema_from_text(recorded.output_schema)
        new = schema_from_text(current.output_schema)
        compatible, lines = schema_change(old, new)
        if not compatible:
            raise ConfigError(
                f"checkpoint {checkpoint}: the output schema changed incompatibly "
                f"({'; '.join(lines)}); the output already holds rows of the old schema and "
                "files of two schemas must not mix in one dataset. Write the new form to a "
                "new output with a new checkpoint (or a new job_version: "
                "docs/versioned-jobs.md); only adding nullable columns evolves in place"
            )
        notes.append(f"output schema evolved compatibly: {'; '.join(lines)}")
    return notes


def claim_checkpoint(
    pipeline: Any,
    layout: CheckpointLayout,
    settings: RecordedSettings,
    accept_changes: bool = False,
) -> list[str]:
    """Refuse a checkpoint of another pipeline; record this one's identity and settings.

    Returns the notes of :func:`check_identity` (accepted changes, a compatible evolution);
    an output type that cannot be turned into a schema is left to the backend's check,
    which names the field.
    """
    from inorder.processor import processor_types
    from inorder.schema import output_schema

    try:
        schema = output_schema(processor_types(pipeline.processor).out)
    except (TypeError, InorderError):
        return []
    current = PipelineIdentity.of(pipeline, schema)
    info = layout.info() or CheckpointInfo()
    recorded = PipelineIdentity.from_json(info.identity) if info.identity else None
    notes = check_identity(recorded, current, layout.root, accept_changes)
    replaced = recorded.to_json() if recorded is not None and recorded != current else None
    layout.write_info(
        info.with_identity(current.to_json(), settings.to_json(), replaced, settings.recorded_at)
    )
    return notes
