"""Output rows as Arrow: derive the schema of a row type and encode rows column-wise.

The public face of :mod:`inorder.rows` (record types, the Arrow mapping, the encoder).

A processor's ``Out`` type defines its output table. Supported record types are dataclasses,
``msgspec.Struct``, ``typing.NamedTuple`` and pydantic models (when pydantic is installed).
Field types map to Arrow as follows (see ``docs/types.md``):

========================================  ==========================================
Python                                     Arrow
========================================  ==========================================
``str``                                    ``string``
``int``                                    ``int64``
``float``                                  ``float64``
``bool``                                   ``bool``
``bytes``                                  ``binary``
``datetime``                               ``timestamp[us, tz=UTC]`` (naive means UTC)
``date``                                   ``date32``
``Decimal``                                ``decimal128(38, 9)``, or
                                           ``Annotated[Decimal, Precision(p, s)]``
``X | None`` / ``Optional[X]``             ``X``, nullable (all other fields are not)
``list[X]``, ``tuple[X, ...]``             ``list<X>``
``dict[str, X]``                           ``map<string, X>``
nested record type                         ``struct``
``Literal["a", "b"]``                      ``string`` (``int64`` for int literals)
``Enum``                                   its values: ``string`` (or ``int64``)
``Annotated[int, pa.int32()]``             the given Arrow type (primitive fields only)
========================================  ==========================================

Every output row also carries ``topic``, ``partition``, ``offset`` (first) and ``batch_id``
(last), added by the engine; an output type that defines one of those names is rejected.

Values are never coerced (:mod:`inorder.value_fit`): a ``float`` (even ``1.0``) or ``True``
in an ``int`` field, an ``int`` beyond the column's width, ``bytes`` in a ``str`` field or a
``datetime`` in a ``date`` field is an error naming the field, not a truncated value. An
``int`` in a ``float`` field is taken (Python's own promotion). A ``Decimal`` with more
fractional digits than the column's scale is an error, never silently rounded.
"""

from __future__ import annotations

from inorder.rows.arrow_mapping import (
    DEFAULT_DECIMAL as DEFAULT_DECIMAL,
)
from inorder.rows.arrow_mapping import (
    RESERVED_COLUMNS as RESERVED_COLUMNS,
)
from inorder.rows.arrow_mapping import (
    RowError as RowError,
)
from inorder.rows.arrow_mapping import (
    arrow_schema as arrow_schema,
)
from inorder.rows.arrow_mapping import (
    arrow_type as arrow_type,
)
from inorder.rows.arrow_mapping import (
    output_schema as output_schema,
)
from inorder.rows.arrow_mapping import (
    spark_ddl as spark_ddl,
)
from inorder.rows.arrow_mapping import (
    spark_schema as spark_schema,
)
from inorder.rows.encoder import (
    RowEncoder as RowEncoder,
)
from inorder.rows.encoder import (
    decode_rows as decode_rows,
)
from inorder.rows.encoder import (
    row_encoder as row_encoder,
)
from inorder.rows.record_types import (
    FieldSpec as FieldSpec,
)
from inorder.rows.record_types import (
    Precision as Precision,
)
from inorder.rows.record_types import (
    check_portable as check_portable,
)
from inorder.rows.record_types import (
    is_pydantic_model as is_pydantic_model,
)
from inorder.rows.record_types import (
    is_record_type as is_record_type,
)
from inorder.rows.record_types import (
    prepare_for_pickling as prepare_for_pickling,
)
from inorder.rows.record_types import (
    record_fields as record_fields,
)
from inorder.rows.record_types import (
    type_name as type_name,
)
