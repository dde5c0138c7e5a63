"""The keys of the table sinks' commit metadata (a Delta commit's ``commitInfo``, an Iceberg
snapshot's summary): the proof ``inorder verify`` reads.

A batch commit carries its app id, batch id, consumed offsets and files; a compaction commit
carries :data:`OPERATION_KEY` = :data:`COMPACT` (and, in Delta, the files it added, with the
rows and digest of each); neither has a batch id then, so it never counts as a batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

APP_ID_KEY = "inorder.app-id"
BATCH_ID_KEY = "inorder.batch-id"
OFFSETS_KEY = "inorder.offsets"
FILES_KEY = "inorder.files"
OPERATION_KEY = "inorder.operation"
COMPACT = "compact"


def proof_json(proof: Mapping[str, tuple[int, str | None]]) -> str:
    """``{path: [rows, digest]}`` as the commit records it (JSON, sorted, compact)."""
    return json.dumps(
        {path: list(entry) for path, entry in proof.items()}, separators=(",", ":"), sort_keys=True
    )
