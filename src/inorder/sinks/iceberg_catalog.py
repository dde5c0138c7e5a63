"""Where an Iceberg sink's table lives: catalog properties, partition specs, table creation.

The embedded default is pyiceberg's SQL catalog on a SQLite file (``catalog_file``), with
the warehouse (data and metadata files) on local disk or S3. Any other pyiceberg catalog
(``type = "rest"``, ``"glue"``, ``"hive"`` ...) is reached by passing its properties through
unchanged. S3 settings of the warehouse are given to pyiceberg's file IO as ``s3.*``
properties unless the catalog properties already set them.

The catalog is opened under the name ``inorder`` (:data:`CATALOG_NAME`): pyiceberg's SQL
catalog stores that name with every table, so a reader opening the same SQLite file must
use it too (``SqlCatalog("inorder", uri=..., warehouse=...)``).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from inorder.errors import ConfigError
from inorder.redaction import is_secret_name
from inorder.sinks.base import SinkError
from inorder.storage import fs as sfs

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table

#: The name the catalog is opened under (the SQL catalog keys its tables by it).
CATALOG_NAME = "inorder"
#: What to run when pyiceberg is not installed.
INSTALL_HINT = "pip install 'inorder[iceberg]'"

#: Partition transforms the executors can compute without pyiceberg's native extension.
TRANSFORMS = ("identity", "year", "month", "day", "hour")

_TRANSFORM_RE = re.compile(r"^\s*(\w+)\s*\(\s*([\w.]+)\s*\)\s*$")


@dataclass(frozen=True, slots=True)
class PartitionField:
    """One field of the table's partition spec: ``transform(source)`` named ``name``."""

    source: str
    transform: str
    name: str


def parse_partition_by(partition_by: Sequence[str]) -> list[PartitionField]:
    """``["topic", "day(kafka_ts)"]`` as partition fields (identity and time transforms)."""
    fields: list[PartitionField] = []
    for text in partition_by:
        match = _TRANSFORM_RE.match(text)
        if match:
            transform, source = match.group(1).lower(), match.group(2)
        else:
            transform, source = "identity", text.strip()
        if transform not in TRANSFORMS:
            raise SinkError(
                f"partition_by {text!r}: transform {transform!r} is not one of "
                f"{', '.join(TRANSFORMS)}"
            )
        name = source if transform == "identity" else f"{source}_{transform}"
        fields.append(PartitionField(source, transform, name))
    return fields


def check_partition_fields(fields: Sequence[PartitionField], schema: pa.Schema, where: str) -> None:
    """Every field's source is an output column of a type its transform takes."""
    for f in fields:
        if f.source not in schema.names:
            raise SinkError(f"{where}: partition_by column {f.source!r} is not in the output")
        t = schema.field(f.source).type
        if f.transform == "identity" and pa.types.is_nested(t):
            raise SinkError(f"{where}: partition_by column {f.source!r} has a nested type")
        if f.transform in ("year", "month", "day") and not (
            pa.types.is_timestamp(t) or pa.types.is_date(t)
        ):
            raise SinkError(f"{where}: {f.transform}({f.source}) needs a timestamp or date column")
        if f.transform == "hour" and not pa.types.is_timestamp(t):
            raise SinkError(f"{where}: hour({f.source}) needs a timestamp column")


def catalog_properties(
    catalog: Mapping[str, str] | None,
    warehouse: str,
    catalog_file: str | None,
    storage_options: Mapping[str, str] | None,
) -> dict[str, str]:
    """The pyiceberg catalog properties of a sink (see the module docstring)."""
    props = {str(k): str(v) for k, v in (catalog or {}).items()}
    props.setdefault("type", "sql")
    # The catalog records each table's location as the warehouse is written: a relative one
    # would be found only from the directory the pipeline ran in.
    props["warehouse"] = _absolute_if_local(props.get("warehouse", warehouse))
    if props["type"] == "sql" and "uri" not in props:
        if catalog_file is None:
            if warehouse.startswith(("s3://", "s3a://")):
                raise SinkError(
                    f"Iceberg warehouse {warehouse}: the SQL catalog's SQLite file must be a "
                    "local path; set catalog_file (or catalog.uri)"
                )
            catalog_file = warehouse.removeprefix("file://").rstrip("/") + "/catalog.db"
        props["uri"] = f"sqlite:///{os.path.abspath(catalog_file.removeprefix('file://'))}"
    if props["warehouse"].startswith(("s3://", "s3a://")):
        s3 = sfs.S3Settings.from_options(storage_options)
        given = {
            "s3.endpoint": s3.endpoint_url,
            "s3.access-key-id": s3.access_key_id,
            "s3.secret-access-key": s3.secret_access_key,
            "s3.session-token": s3.session_token,
            "s3.region": s3.region,
        }
        for key, value in given.items():
            if value:
                props.setdefault(key, value)
    return props


def _absolute_if_local(path: str) -> str:
    """A local path or ``file://`` URI made absolute; any other URI as given."""
    if path.startswith("file://"):
        return "file://" + os.path.abspath(path.removeprefix("file://"))
    return path if "://" in path else os.path.abspath(path)


def secrets_of(props: Mapping[str, str]) -> tuple[str, ...]:
    """The secret values among catalog properties (to blank them out of messages)."""
    return tuple(v for k, v in props.items() if is_secret_name(k) and v)


def describe_catalog(props: Mapping[str, str]) -> str:
    """The catalog in a few words, without credentials."""
    kind = props.get("type", "sql")
    if kind == "sql":
        uri = props.get("uri", "")
        if uri.startswith("sqlite:///"):
            return f"SQL catalog {uri.removeprefix('sqlite:///')}"
        return "SQL catalog"  # a database URI may hold a password
    where = props.get("uri", "")
    # A REST URI may carry user info: show scheme, host and path only.
    if "@" in where:
        scheme, _, rest = where.partition("://")
        where = f"{scheme}://{rest.rsplit('@', 1)[-1]}"
    return f"{kind} catalog {where}".rstrip()


def require_pyiceberg(what: str = "Iceberg") -> None:
    """Raise a one-line :class:`ConfigError` naming the extra to install when pyiceberg is
    missing (it is an optional dependency: ``inorder[iceberg]``)."""
    try:
        importlib.import_module("pyiceberg")
    except ImportError:
        raise ConfigError(
            f"{what} needs pyiceberg, which is not installed: {INSTALL_HINT}"
        ) from None


def open_catalog(props: Mapping[str, str], name: str = CATALOG_NAME) -> Catalog:
    """Open the catalog; :class:`SinkError` naming the catalog when it cannot be reached,
    :class:`ConfigError` when pyiceberg is not installed."""
    require_pyiceberg()
    from pyiceberg.catalog import load_catalog

    uri = props.get("uri", "")
    if props.get("type") == "sql" and uri.startswith("sqlite:///"):
        # SQLite creates the file, not its directory.
        os.makedirs(os.path.dirname(uri.removeprefix("sqlite:///")) or ".", exist_ok=True)
    try:
        return load_catalog(name, **dict(props))
    except Exception as exc:
        raise SinkError(
            f"cannot open Iceberg {describe_catalog(props)}: "
            f"{sfs.describe_error(exc, secrets_of(props))}"
        ) from None


def create_table(
    catalog: Catalog,
    identifier: str,
    schema: pa.Schema,
    fields: Sequence[PartitionField],
    properties: Mapping[str, str] | None,
) -> Table:
    """Create the table (and its namespace) from the output's Arrow schema and partitioning.

    Field ids are assigned by the catalog; the partition spec refers to them by name, so it
    is added in the same transaction that creates the table.
    """
    from pyiceberg.exceptions import TableAlreadyExistsError
    from pyiceberg.transforms import (
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        Transform,
        YearTransform,
    )

    transforms: dict[str, Transform[Any, Any]] = {
        "identity": IdentityTransform(),
        "year": YearTransform(),
        "month": MonthTransform(),
        "day": DayTransform(),
        "hour": HourTransform(),
    }
    namespace = identifier.rsplit(".", 1)[0]
    catalog.create_namespace_if_not_exists(namespace)
    try:
        tx = catalog.create_table_transaction(
            identifier, schema=schema, properties=dict(properties or {})
        )
        if fields:
            with tx.update_spec() as spec:
                for f in fields:
                    spec.add_field(f.source, transforms[f.transform], f.name)
        tx.commit_transaction()
    except TableAlreadyExistsError:
        pass  # another process created it first: use theirs (checked by the caller)
    return catalog.load_table(identifier)


def rows_from_filter(starts: Mapping[tuple[str, int], int]) -> BooleanExpression | None:
    """An Iceberg filter of the rows at or after ``starts[(topic, partition)]`` (what
    ``inorder repair`` deletes); ``None`` when ``starts`` is empty."""
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, Or, Reference
    from pyiceberg.expressions.literals import literal

    terms: list[BooleanExpression] = [
        And(
            EqualTo(term=Reference("topic"), value=literal(topic)),
            And(
                EqualTo(term=Reference("partition"), value=literal(partition)),
                GreaterThanOrEqual(term=Reference("offset"), value=literal(start)),
            ),
        )
        for (topic, partition), start in sorted(starts.items())
    ]
    if not terms:
        return None
    condition = terms[0]
    for term in terms[1:]:
        condition = Or(condition, term)
    return condition
