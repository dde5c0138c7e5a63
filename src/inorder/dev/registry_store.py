"""The local schema registry's data: schemas by id, subjects and their versions, levels.

It follows the Confluent Schema Registry's model, the part confluent-kafka's clients use:

* a schema (type, text, references) gets one global id; registering the same schema again,
  under any subject, gives the same id;
* a subject is a list of versions (1, 2, ...), each pointing at a schema id; registering a
  schema a subject already holds returns that version instead of adding one;
* a new version must pass the subject's compatibility level (else the subject's default,
  else the global one, ``BACKWARD`` unless changed) against the latest version, or all of
  them for the ``_TRANSITIVE`` levels (:mod:`inorder.dev.registry_compat` checks pairs);
* deletes are soft first (the version is hidden but its id still resolves); a permanent
  delete needs the soft one before it, as in the Confluent registry.

Everything is kept in one JSON file, rewritten atomically after each change, so a registry
restarted on the same state directory serves the same ids. One lock serialises requests.
:class:`RegistryError` carries the HTTP status and Confluent error code the server answers.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inorder.dev.registry_compat import (
    SCHEMA_TYPES,
    InvalidSchema,
    canonical,
    check_schema,
    incompatibilities,
)

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
DEFAULT_LEVEL = "BACKWARD"


@dataclass
class RegistryError(Exception):
    """An error answer: HTTP status, Confluent error code and message."""

    status: int
    code: int
    message: str

    def __str__(self) -> str:
        return self.message


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


class RegistryStore:
    """Schemas, subjects and compatibility levels, persisted to ``path`` (JSON)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Reentrant: the server holds it around a whole request, whose store calls take it too.
        self.lock = threading.RLock()
        # id -> {"schemaType", "schema", "references"}
        self.schemas: dict[int, dict[str, Any]] = {}
        # subject -> [{"version", "id", "deleted"}] in version order
        self.subjects: dict[str, list[dict[str, Any]]] = {}
        self.levels: dict[str, str] = {}  # subject -> level; "" is the global level
        self._load()

    # ----------------------------------------------------------------------- persistence

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, json.JSONDecodeError) as exc:
            raise RuntimeError(f"cannot read the registry's data {self.path}: {exc}") from None
        self.schemas = {int(k): v for k, v in data.get("schemas", {}).items()}
        self.subjects = data.get("subjects", {})
        self.levels = data.get("levels", {})

    def _save(self) -> None:
        data = {"schemas": self.schemas, "subjects": self.subjects, "levels": self.levels}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)

    # ----------------------------------------------------------------------- reading

    def schema(self, schema_id: int) -> dict[str, Any]:
        """The schema with this id (type, text, references): 40403 if there is none."""
        found = self.schemas.get(schema_id)
        if found is None:
            raise RegistryError(404, 40403, f"Schema {schema_id} not found")
        return found

    def subject_names(self, deleted: bool = False) -> list[str]:
        """Subjects holding at least one version (also soft-deleted ones with ``deleted``)."""
        return sorted(
            s for s, vs in self.subjects.items() if any(deleted or not v["deleted"] for v in vs)
        )

    def versions(self, subject: str, deleted: bool = False) -> list[dict[str, Any]]:
        """The subject's versions, oldest first: 40401 if it has none left."""
        found = [v for v in self.subjects.get(subject, []) if deleted or not v["deleted"]]
        if not found:
            raise _subject_not_found(subject)
        return found

    def version(self, subject: str, version: str, deleted: bool = False) -> dict[str, Any]:
        """One version, ``latest`` or ``-1`` for the newest: 40401, 40402 or 42202."""
        versions = self.versions(subject, deleted)
        if version in ("latest", "-1"):
            return versions[-1]
        try:
            number = int(version)
        except ValueError:
            number = 0
        if number < 1:
            raise RegistryError(
                422, 42202, f"The specified version '{version}' is not a valid version id."
            )
        for entry in versions:
            if entry["version"] == number:
                return entry
        raise RegistryError(404, 40402, f"Version {version} not found.")

    def uses(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        """(subject, version) pairs that point at a schema id."""
        return [
            (subject, v["version"])
            for subject, vs in sorted(self.subjects.items())
            for v in vs
            if v["id"] == schema_id and (deleted or not v["deleted"])
        ]

    def referenced_by(self, subject: str, version: int) -> list[int]:
        """Ids of the schemas whose references name this subject version."""
        return sorted(
            sid
            for sid, s in self.schemas.items()
            if any(
                r.get("subject") == subject and r.get("version") == version for r in s["references"]
            )
        )

    def level(self, subject: str | None, default_to_global: bool = True) -> str:
        """The subject's compatibility level (else the global one): 40408 if not set."""
        if subject is None:
            return self.levels.get("", DEFAULT_LEVEL)
        if subject in self.levels:
            return self.levels[subject]
        if default_to_global:
            return self.levels.get("", DEFAULT_LEVEL)
        raise RegistryError(
            404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured"
        )

    # ----------------------------------------------------------------------- schemas

    def _parse(self, body: Any) -> tuple[str, str, list[dict[str, Any]]]:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise RegistryError(422, 42201, "Invalid schema: the body needs a 'schema' string")
        schema_type = str(body.get("schemaType") or "AVRO").upper()
        if schema_type not in SCHEMA_TYPES:
            raise RegistryError(422, 42201, f"Invalid schema type {schema_type!r}")
        references = []
        for ref in body.get("references") or []:
            if not isinstance(ref, dict) or not {"name", "subject", "version"} <= set(ref):
                raise RegistryError(
                    422, 42201, "Invalid schema: a reference needs name, subject and version"
                )
            references.append(
                {
                    "name": str(ref["name"]),
                    "subject": str(ref["subject"]),
                    "version": ref["version"],
                }
            )
        return schema_type, body["schema"], references

    def resolved(self, references: list[dict[str, Any]]) -> dict[str, str]:
        """The text of every schema ``references`` name, transitively, dependencies first."""
        out: dict[str, str] = {}
        for ref in references:
            try:
                entry = self.version(ref["subject"], str(ref["version"]))
            except RegistryError:
                raise RegistryError(
                    422,
                    42201,
                    f"Invalid schema: reference {ref['name']!r} names subject "
                    f"{ref['subject']!r} version {ref['version']}, which is not registered",
                ) from None
            target = self.schemas[entry["id"]]
            out.update(self.resolved(target["references"]))
            out[ref["name"]] = target["schema"]
        return out

    def _find_id(self, schema_type: str, text: str, references: list[dict[str, Any]]) -> int | None:
        key = canonical(schema_type, text)
        for sid, known in self.schemas.items():
            if (
                known["schemaType"] == schema_type
                and known["references"] == references
                and canonical(schema_type, known["schema"]) == key
            ):
                return sid
        return None

    def _against(self, subject: str, level: str) -> list[dict[str, Any]]:
        live = [v for v in self.subjects.get(subject, []) if not v["deleted"]]
        return live if level.endswith("_TRANSITIVE") else live[-1:]

    def _problems(
        self,
        level: str,
        against: list[dict[str, Any]],
        schema_type: str,
        text: str,
        refs: dict[str, str],
    ) -> list[str]:
        if level == "NONE":
            return []
        problems: list[str] = []
        for entry in against:
            old = self.schemas[entry["id"]]
            if old["schemaType"] != schema_type:
                problems.append(
                    f"version {entry['version']} is {old['schemaType']}, not {schema_type}"
                )
                continue
            old_refs = self.resolved(old["references"])
            pairs = []
            if level.startswith(("BACKWARD", "FULL")):
                pairs.append((text, refs, old["schema"], old_refs))  # new reads old
            if level.startswith(("FORWARD", "FULL")):
                pairs.append((old["schema"], old_refs, text, refs))  # old reads new
            for reader, r_refs, writer, w_refs in pairs:
                for line in incompatibilities(schema_type, reader, writer, r_refs, w_refs):
                    problems.append(f"version {entry['version']}: {line}")
        return problems

    def compatibility(self, subject: str, body: Any, version: str | None) -> list[str]:
        """Why ``body`` would be refused by the subject's level: against the versions the
        level names (``version`` None), or against that one version alone."""
        with self.lock:
            schema_type, text, references = self._parse(body)
            refs = self.resolved(references)
            self._check(schema_type, text, refs)
            level = self.level(subject)
            if version is None:
                against = self._against(subject, level)
            elif subject not in self.subject_names():
                return []
            else:
                against = [self.version(subject, version)]
            return self._problems(level, against, schema_type, text, refs)

    @staticmethod
    def _check(schema_type: str, text: str, refs: dict[str, str]) -> None:
        try:
            check_schema(schema_type, text, refs)
        except InvalidSchema as exc:
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None

    def register(self, subject: str, body: Any) -> dict[str, Any]:
        """Register ``body`` under ``subject``: its id and version (409 if incompatible)."""
        with self.lock:
            schema_type, text, references = self._parse(body)
            refs = self.resolved(references)
            self._check(schema_type, text, refs)
            existing = self._find_id(schema_type, text, references)
            for entry in self.subjects.get(subject, []):
                if entry["id"] == existing and not entry["deleted"]:
                    return self._answer(subject, entry)
            level = self.level(subject)
            against = self._against(subject, level)
            problems = self._problems(level, against, schema_type, text, refs)
            if problems:
                raise RegistryError(
                    409,
                    409,
                    "Schema being registered is incompatible with an earlier schema for "
                    f'subject "{subject}" ({level}): ' + "; ".join(problems),
                )
            if existing is None:
                existing = max(self.schemas, default=0) + 1
                self.schemas[existing] = {
                    "schemaType": schema_type,
                    "schema": text,
                    "references": references,
                }
            versions = self.subjects.setdefault(subject, [])
            number = max((v["version"] for v in versions), default=0) + 1
            entry = {"version": number, "id": existing, "deleted": False}
            versions.append(entry)
            self._save()
            return self._answer(subject, entry)

    def lookup(self, subject: str, body: Any, deleted: bool = False) -> dict[str, Any]:
        """The version of ``subject`` holding ``body``: 40401 or 40403 if there is none."""
        with self.lock:
            schema_type, text, references = self._parse(body)
            versions = self.versions(subject, deleted)
            sid = self._find_id(schema_type, text, references)
            for entry in reversed(versions):
                if entry["id"] == sid:
                    return self._answer(subject, entry)
            raise RegistryError(404, 40403, "Schema not found")

    def _answer(self, subject: str, entry: dict[str, Any]) -> dict[str, Any]:
        return {"subject": subject, "version": entry["version"], **self.body(entry["id"])}

    def body(self, schema_id: int) -> dict[str, Any]:
        """A schema as the REST API shows it (``schemaType`` left out for Avro, as upstream)."""
        known = self.schema(schema_id)
        out: dict[str, Any] = {"id": schema_id, "schema": known["schema"]}
        if known["schemaType"] != "AVRO":
            out["schemaType"] = known["schemaType"]
        if known["references"]:
            out["references"] = known["references"]
        return out

    # ----------------------------------------------------------------------- changes

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        """Soft-delete every version, or remove the soft-deleted ones for good."""
        with self.lock:
            versions = self.subjects.get(subject)
            if not versions:
                raise _subject_not_found(subject)
            if permanent:
                if any(not v["deleted"] for v in versions):
                    raise RegistryError(
                        404,
                        40405,
                        f"Subject '{subject}' was not deleted first before being permanently "
                        "deleted",
                    )
                del self.subjects[subject]
                self.levels.pop(subject, None)
                gone = [v["version"] for v in versions]
            else:
                live = [v for v in versions if not v["deleted"]]
                if not live:
                    raise RegistryError(404, 40404, f"Subject '{subject}' was soft deleted.")
                for v in live:
                    v["deleted"] = True
                gone = [v["version"] for v in live]
            self._save()
            return gone

    def delete_version(self, subject: str, version: str, permanent: bool) -> int:
        """Soft-delete one version, or remove a soft-deleted one for good."""
        with self.lock:
            entry = self.version(subject, version, deleted=permanent)
            if permanent:
                if not entry["deleted"]:
                    raise RegistryError(
                        404,
                        40407,
                        f"Subject '{subject}' Version {entry['version']} was not deleted first "
                        "before being permanently deleted",
                    )
                self.subjects[subject].remove(entry)
            else:
                entry["deleted"] = True
            self._save()
            return int(entry["version"])

    def set_level(self, subject: str | None, level: Any) -> str:
        """Set the global (``subject`` None) or a subject's compatibility level: 42203."""
        name = str(level or "").upper()
        if name not in LEVELS:
            raise RegistryError(
                422, 42203, f"Invalid compatibility level {level!r}: one of {', '.join(LEVELS)}"
            )
        with self.lock:
            self.levels["" if subject is None else subject] = name
            self._save()
        return name

    def clear_level(self, subject: str | None) -> str:
        """Remove a subject's level (back to the global one) or reset the global one."""
        with self.lock:
            old = self.levels.pop("" if subject is None else subject, DEFAULT_LEVEL)
            self._save()
        return old
