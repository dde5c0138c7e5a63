"""The local schema registry of ``inorder dev up``, driven by confluent-kafka's own client,
serializers and deserializers: Avro, Protobuf and JSON Schema framing, compatibility levels,
lookups and deletes, persistence across ``down``/``up``, and ``inorder simulate --format``
through the real broker into inorder's codecs."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2

from inorder import cli, endpoints
from inorder.codecs import AvroCodec, JsonSchemaCodec, ProtobufCodec, SchemaRegistry
from inorder.codecs.protobuf import message_class
from inorder.dev import processes, services
from inorder.dev.registry_server import make_server
from inorder.dev.registry_store import RegistryStore
from inorder.dev.sim_formats import session_message_class

V1 = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "site", "type": "string"}, {"name": "value", "type": "long"}],
}
V2 = {**V1, "fields": [*V1["fields"], {"name": "unit", "type": "string", "default": "C"}]}
# A new field without a default: the new schema cannot read what V2 wrote.
NO_DEFAULT = {**V1, "fields": [*V1["fields"], {"name": "room", "type": "string"}]}


def ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """The registry server in this process (same code ``dev up`` runs), on a free port."""
    server = make_server(RegistryStore(tmp_path / "registry.json"), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _fresh(url: str) -> SchemaRegistryClient:
    """A client with an empty cache, as a consumer in another process has."""
    return SchemaRegistryClient({"url": url})


def test_avro_evolution_and_backward_compatibility(registry: str) -> None:
    client = _fresh(registry)
    v1 = AvroSerializer(client, json.dumps(V1))({"site": "a", "value": 1}, ctx("t"))
    v2 = AvroSerializer(client, json.dumps(V2))({"site": "b", "value": 2, "unit": "F"}, ctx("t"))
    assert v1[0] == 0 and v1[1:5] != v2[1:5]  # framed, two schema ids
    reader = AvroDeserializer(_fresh(registry))
    assert reader(v1, ctx("t")) == {"site": "a", "value": 1}
    assert reader(v2, ctx("t")) == {"site": "b", "value": 2, "unit": "F"}
    # Registering V1 again (another subject too) gives the same id, no new version.
    again = AvroSerializer(client, json.dumps(V1))({"site": "a", "value": 1}, ctx("other"))
    assert again[1:5] == v1[1:5]
    assert client.get_versions("t-value") == [1, 2]
    latest = client.get_latest_version("t-value")
    assert (latest.version, json.loads(latest.schema.schema_str)) == (2, V2)

    # BACKWARD (the default) refuses a field without a default, naming it.
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema("t-value", Schema(json.dumps(NO_DEFAULT), "AVRO"))
    assert refused.value.http_status_code == 409
    assert "room" in refused.value.error_message and "BACKWARD" in refused.value.error_message
    assert client.test_compatibility("t-value", Schema(json.dumps(NO_DEFAULT), "AVRO")) is False
    assert client.test_compatibility("t-value", Schema(json.dumps(V2), "AVRO")) is True
    # NONE on the subject lets it through; the global level stays BACKWARD.
    client.set_compatibility("t-value", "NONE")
    client.register_schema("t-value", Schema(json.dumps(NO_DEFAULT), "AVRO"))
    assert client.get_compatibility("t-value") == "NONE"
    assert client.get_compatibility() == "BACKWARD"
    # FORWARD_TRANSITIVE on another subject: every old schema must read the new one.
    client.set_compatibility("f-value", "FORWARD_TRANSITIVE")
    client.register_schema("f-value", Schema(json.dumps(V2), "AVRO"))
    site_only = {**V1, "fields": [V1["fields"][0]]}  # V2 cannot read it: no `value`
    with pytest.raises(SchemaRegistryError, match="value"):
        client.register_schema("f-value", Schema(json.dumps(site_only), "AVRO"))

    with pytest.raises(SchemaRegistryError) as unknown:
        _fresh(registry).get_schema(999)
    assert (unknown.value.http_status_code, unknown.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as invalid:
        client.register_schema("bad-value", Schema('{"type": "record"}', "AVRO"))
    assert (invalid.value.http_status_code, invalid.value.error_code) == (422, 42201)


def test_lookups_and_deletes(registry: str) -> None:
    client = _fresh(registry)
    schema = Schema(json.dumps(V1), "AVRO")
    sid = client.register_schema("d-value", schema)
    found = _fresh(registry).lookup_schema("d-value", schema)
    assert (found.schema_id, found.version) == (sid, 1)
    assert client.get_subjects() == ["d-value"]
    with pytest.raises(SchemaRegistryError) as early:
        client.delete_subject("d-value", permanent=True)  # soft delete first, as upstream
    assert early.value.error_code == 40405
    assert client.delete_subject("d-value") == [1]
    assert client.get_subjects() == []
    assert _fresh(registry).get_schema(sid).schema_str == json.dumps(V1)  # id still resolves
    assert client.delete_subject("d-value", permanent=True) == [1]
    with pytest.raises(SchemaRegistryError) as gone:
        _fresh(registry).get_version("d-value", 1)
    assert gone.value.error_code == 40401


def _reading_proto(value_type: int) -> Any:
    fd = descriptor_pb2.FileDescriptorProto(name="reading.proto", package="demo", syntax="proto3")
    msg = fd.message_type.add(name="Reading")
    msg.field.add(name="site", number=1, type=9, label=1)  # string
    msg.field.add(name="value", number=2, type=value_type, label=1)
    files = descriptor_pb2.FileDescriptorSet(file=[fd]).SerializeToString()
    return message_class(files, "demo.Reading")


def test_protobuf_and_json_schema_with_their_own_checks(registry: str) -> None:
    client = _fresh(registry)
    conf = {"use.deprecated.format": False}
    int64_cls = _reading_proto(3)  # int64
    framed = ProtobufSerializer(int64_cls, client, conf)(int64_cls(site="a", value=7), ctx("p"))
    decoded = ProtobufDeserializer(int64_cls, conf, _fresh(registry))(framed, ctx("p"))
    assert (decoded.site, decoded.value) == ("a", 7)
    # int32 shares int64's varint encoding: compatible; string does not: refused.
    int32_cls = _reading_proto(5)
    ProtobufSerializer(int32_cls, client, conf)(int32_cls(site="b", value=1), ctx("p"))
    string_cls = _reading_proto(9)
    with pytest.raises(Exception, match=r"field 2 \(value\): type changed from int32 to string"):
        ProtobufSerializer(string_cls, client, conf)(string_cls(site="c", value="x"), ctx("p"))

    schema = {
        "type": "object",
        "properties": {"site": {"type": "string"}, "value": {"type": "integer"}},
        "required": ["site"],
    }
    doc = JSONSerializer(json.dumps(schema), client)({"site": "a", "value": 1}, ctx("j"))
    assert JSONDeserializer(None, schema_registry_client=_fresh(registry))(doc, ctx("j")) == {
        "site": "a",
        "value": 1,
    }
    stricter = {**schema, "required": ["site", "value"]}
    with pytest.raises(SchemaRegistryError, match="properties/value is required now"):
        client.register_schema("j-value", Schema(json.dumps(stricter), "JSON"))


def test_dev_up_registry_persists_and_serves_the_codecs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(endpoints.ENV_SCHEMA_REGISTRY, raising=False)
    state_dir = tmp_path / "dev"
    (report,) = services.up(state_dir, registry_port=0, only=["registry"], die_with_parent=True)
    try:
        url = str(report.entry["url"])
        assert url.startswith("http://127.0.0.1:") and report.state == "started"
        assert endpoints.read_services_file(state_dir)["registry"]["url"] == url
        assert endpoints.schema_registry_url(state_dir) == url
        value = AvroSerializer(_fresh(url), json.dumps(V1))({"site": "a", "value": 5}, ctx("t"))
        assert cli.main(["dev", "status", "--state-dir", str(state_dir), "--only", "registry"]) == 0
        assert "subjects ok: 1 subject(s)" in capsys.readouterr().out

        # down, then up on the same port: the same id still decodes.
        services.down(state_dir, only=["registry"])
        assert not processes.tcp_open(int(report.entry["port"]))
        (again,) = services.up(state_dir, only=["registry"], die_with_parent=True)
        assert again.entry["url"] == url
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv(endpoints.ENV_STATE_DIR, str(state_dir))
        codec = AvroCodec(dict, registry=SchemaRegistry())  # found through services.json
        assert codec.decode(value, None) == {"site": "a", "value": 5}
    finally:
        services.down(state_dir, only=["registry"])


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "json-schema"])
def test_simulate_format_frames_every_session_message(
    kafka: Any, registry: str, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"fmt-{fmt}-{uuid.uuid4().hex[:8]}-"
    code = cli.main(
        ["simulate", "--bootstrap-servers", kafka.bootstrap_servers, "--format", fmt,
         "--registry-url", registry, "--topic-prefix", prefix, "--sites", "1",
         "--partitions", "1", "--messages", "200", "--json"]
    )  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["format"] == fmt and summary["records"] == 200
    reg = SchemaRegistry(registry)
    codec = {
        "avro": lambda: AvroCodec(dict, registry=reg),
        "protobuf": lambda: ProtobufCodec(dict, message=session_message_class(), registry=reg),
        "json-schema": lambda: JsonSchemaCodec(dict, registry=reg),
    }[fmt]()
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": prefix,
         "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )  # fmt: skip
    consumer.subscribe([f"{prefix}000"])
    seen: list[dict[str, Any]] = []
    try:
        while len(seen) < 200:
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(seen)} of 200 records arrived"
            value = msg.value()
            assert value is not None and value[0] == 0  # framed: magic byte 0
            seen.append(codec.decode(value, None))
    finally:
        consumer.close()
    assert seen[0]["type"] == "snapshot" and seen[0]["rows"]
    assert {m["type"] for m in seen} >= {"snapshot", "insert", "update", "delete"}
    assert all(m["session"].startswith(prefix) for m in seen)
    assert _fresh(registry).get_subjects() == [f"{prefix}000-value"]


@pytest.mark.parametrize("fmt", ["protobuf", "json-schema"])
def test_sessions_pipeline_reads_framed_simulation_exactly(
    kafka: Any, spark: Any, registry: str, fmt: str, tmp_path: Path
) -> None:
    """The session job over registry-framed traffic with faults (malformed records arrive
    unframed): its tables are exactly the simulator's truth, as over JSON."""
    from tests.fixtures.sessions_job import (
        RESTART_SESSION,
        TWO_LOCAL_CORES,
        check_truth,
        sessions_config,
        small_simulation,
    )

    from inorder.assemble import build_pipeline
    from inorder.dev.sim_formats import framed_encoder
    from inorder.dev.simulator import simulate
    from inorder.sessions.rebuild import read_changes

    prefix = f"framed-{fmt}-{uuid.uuid4().hex[:8]}-"
    sim = small_simulation(prefix, seed=5, faulty=0.5)
    result = simulate(sim, kafka.bootstrap_servers, encode=framed_encoder(fmt, registry))
    assert result.ground_truth.faults, "the simulation injected faults"
    codec: dict[str, Any] = {"type": fmt.replace("-", "_"), "registry_url": registry}
    if fmt == "protobuf":
        codec["message_type"] = "inorder.dev.sim_formats:SessionMessage"
    cfg = sessions_config(
        kafka.bootstrap_servers,
        prefix,
        tmp_path,
        codec=codec,
        integrity=RESTART_SESSION,
        spark=TWO_LOCAL_CORES,
    )
    build_pipeline(cfg).run()
    changes = read_changes(str(tmp_path / "output"))
    assert check_truth(changes, result.ground_truth) == []
