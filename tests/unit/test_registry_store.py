"""The dev schema registry's store and routes without a socket: ids, versions after deletes,
references, persistence, levels per format, and the error answers of the HTTP layer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from inorder.dev.registry_server import handle
from inorder.dev.registry_store import RegistryError, RegistryStore
from inorder.dev.sim_formats import AVRO_SCHEMA, JSON_SCHEMA, session_proto_file

UNIT = {"type": "enum", "name": "Unit", "namespace": "demo", "symbols": ["C", "F"]}
READING = {
    "type": "record",
    "name": "Reading",
    "namespace": "demo",
    "fields": [{"name": "value", "type": "long"}, {"name": "unit", "type": "demo.Unit"}],
}


def avro(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"schema": json.dumps(schema), **extra}


def test_ids_versions_deletes_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    store = RegistryStore(path)
    first = store.register("a", avro(AVRO_SCHEMA))
    assert (first["id"], first["version"]) == (1, 1)
    assert "schemaType" not in first  # Avro is the default type, left out as upstream does
    # Same schema, whitespace aside: same id and version; another subject: same id, version 1.
    spaced = {"schema": json.dumps(AVRO_SCHEMA, indent=4)}
    assert store.register("a", spaced)["version"] == 1
    assert store.register("b", spaced) == {**first, "subject": "b"}
    store.set_level("a", "NONE")
    second = store.register("a", {"schema": json.dumps(JSON_SCHEMA), "schemaType": "JSON"})
    assert (second["id"], second["version"], second["schemaType"]) == (2, 2, "JSON")
    assert store.delete_version("a", "2", permanent=False) == 2
    third = store.register("a", {"schema": json.dumps(JSON_SCHEMA), "schemaType": "JSON"})
    assert (third["id"], third["version"]) == (2, 3)  # numbers are never reused
    assert [v["version"] for v in store.versions("a", deleted=True)] == [1, 2, 3]
    with pytest.raises(RegistryError) as caught:
        store.delete_version("a", "3", permanent=True)
    assert caught.value.code == 40407

    again = RegistryStore(path)  # a restarted server on the same state directory
    assert again.schema(2)["schemaType"] == "JSON"
    assert again.level("a") == "NONE" and again.level("b") == "BACKWARD"
    assert [v["version"] for v in again.versions("a")] == [1, 3]
    assert again.uses(1) == [("a", 1), ("b", 1)]
    assert again.register("c", avro(AVRO_SCHEMA))["id"] == 1


def test_avro_references_are_resolved_checked_and_tracked(tmp_path: Path) -> None:
    store = RegistryStore(tmp_path / "r.json")
    store.register("unit", avro(UNIT))
    ref = [{"name": "demo.Unit", "subject": "unit", "version": 1}]
    reading = store.register("reading", avro(READING, references=ref))
    assert reading["references"] == ref
    assert store.referenced_by("unit", 1) == [reading["id"]]
    with pytest.raises(RegistryError, match="names subject 'nope' version 1") as missing:
        store.register("x", avro(READING, references=[{**ref[0], "subject": "nope"}]))
    assert (missing.value.status, missing.value.code) == (422, 42201)
    with pytest.raises(RegistryError, match=r"demo\.Unit") as unknown_type:
        store.register("y", avro(READING))  # the named type without its reference
    assert unknown_type.value.code == 42201


def test_levels_per_format(tmp_path: Path) -> None:
    store = RegistryStore(tmp_path / "r.json")
    closed = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "number"}},
        "additionalProperties": False,
    }
    store.register("j", {"schema": json.dumps(closed), "schemaType": "JSON"})
    smaller = {**closed, "properties": {"a": {"type": "string"}}}
    problems = store.compatibility("j", {"schema": json.dumps(smaller), "schemaType": "JSON"}, None)
    assert problems == ["version 1: JSON Schema: #/properties/b removed from a closed object"]
    integer_b = {**closed, "properties": {**closed["properties"], "b": {"type": "integer"}}}
    assert store.compatibility(
        "j", {"schema": json.dumps(integer_b), "schemaType": "JSON"}, "latest"
    ) == [
        "version 1: JSON Schema: #/properties/b type narrowed: "
        "integer, number no longer all accepted"
    ]

    # FULL_TRANSITIVE: a default-less field fails against every version, in both directions.
    store.set_level(None, "FULL_TRANSITIVE")
    v1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    store.register("r", avro(v1))
    v2 = {**v1, "fields": [*v1["fields"], {"name": "b", "type": "long", "default": 0}]}
    store.register("r", avro(v2))
    v3 = {**v1, "fields": [*v1["fields"], {"name": "c", "type": "long"}]}
    found = store.compatibility("r", avro(v3), None)
    assert [p.split(":")[0] for p in found] == ["version 1", "version 2"]
    with pytest.raises(RegistryError, match="FULL_TRANSITIVE") as refused:
        store.register("r", avro(v3))
    assert refused.value.status == 409
    with pytest.raises(RegistryError) as bad_level:
        store.set_level("r", "SIDEWAYS")
    assert bad_level.value.code == 42203


def _proto_text(fd: Any) -> str:
    import base64

    return base64.b64encode(fd.SerializeToString()).decode()


def test_protobuf_checks_and_text_schemas_refused(tmp_path: Path) -> None:
    store = RegistryStore(tmp_path / "r.json")
    fd = session_proto_file()
    store.register("p", {"schema": _proto_text(fd), "schemaType": "PROTOBUF"})
    renamed = descriptor_pb2.FileDescriptorProto()
    renamed.CopyFrom(fd)
    renamed.message_type[1].field[0].name = "kind"  # a rename keeps the wire format
    body = {"schema": _proto_text(renamed), "schemaType": "PROTOBUF"}
    assert store.compatibility("p", body, None) == []
    dropped = descriptor_pb2.FileDescriptorProto()
    dropped.CopyFrom(fd)
    del dropped.message_type[0]  # Row is gone, and SessionMessage still names it
    body = {"schema": _proto_text(dropped), "schemaType": "PROTOBUF"}
    with pytest.raises(RegistryError, match=r"message inorder\.sim\.Row removed"):
        store.register("p", body)
    text = 'syntax = "proto3"; message M { string a = 1; }'
    with pytest.raises(RegistryError, match=r"\.proto source text is not parsed") as refused:
        store.register("q", {"schema": text, "schemaType": "PROTOBUF"})
    assert refused.value.code == 42201


def test_http_layer_answers_errors_as_the_confluent_registry(tmp_path: Path) -> None:
    store = RegistryStore(tmp_path / "r.json")
    status, body = handle(
        store, "POST", "/subjects/a%2Fb-value/versions", b'{"schema": "\\"long\\""}'
    )
    assert (status, body["subject"], body["version"]) == (200, "a/b-value", 1)
    assert handle(store, "GET", "/subjects", b"") == (200, ["a/b-value"])
    assert handle(store, "GET", "/subjects/a%2Fb-value/versions/latest/schema", b"") == (
        200,
        "long",
    )
    assert handle(store, "GET", "/schemas/ids/7", b"")[1]["error_code"] == 40403
    assert handle(store, "GET", "/subjects/nope/versions", b"")[1]["error_code"] == 40401
    assert handle(store, "GET", "/subjects/a%2Fb-value/versions/0", b"")[1]["error_code"] == 42202
    assert handle(store, "GET", "/config/a%2Fb-value", b"")[1]["error_code"] == 40408
    assert handle(store, "GET", "/config/a%2Fb-value?defaultToGlobal=true", b"") == (
        200,
        {"compatibilityLevel": "BACKWARD"},
    )
    assert handle(store, "PUT", "/schemas/types", b"{}")[0] == 405
    assert handle(store, "GET", "/subjects/a/metadata", b"")[0] == 404
    status, body = handle(store, "POST", "/subjects/x/versions", b"{not json")
    assert status == 400 and "not JSON" in body["message"]
