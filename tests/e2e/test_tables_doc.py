"""docs/tables.md, run verbatim: every ```bash and ```python block of the page, in order.

The blocks run as a user runs them: in a fresh directory, one ``bash -e`` per shell block and a
fresh ``python -`` per Python block, with the virtualenv's ``bin`` first on ``PATH`` and the
test session's broker as ``INORDER_KAFKA_BOOTSTRAP_SERVERS`` (the page's "a broker to reach").
``pip`` runs with ``PIP_NO_INDEX=1``: the page's install must already be satisfied by the
virtualenv, so nothing is downloaded. A Python block that prints must print exactly the plain
block that follows it on the page.

Beside the page's own output, every table is checked against what the change log gives: the
current table against ``rebuild_tables`` of the change log, the history's versions against its
``insert``/``update`` rows, the as-of answers against the change log replayed up to the
offset, the Iceberg tables against the Delta ones, and the catalog name the page gives
against pyiceberg's answer under another name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from tests.fixtures.services import KafkaService

from inorder.sessions.rebuild import rebuild_tables

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tables.md"
VENV_BIN = Path(sys.executable).parent
TABLES = ".inorder/tables"
WAREHOUSE = ".inorder/tables-iceberg/warehouse"
#: The as-of query of the page: this session, as of this offset of its partition.
AS_OF_TOPIC, AS_OF_SESSION, AS_OF_OFFSET = "plant-001", "plant-001-0000", 500
#: Names that must not leak from the test session into the user's shell.
_DROPPED = ("INORDER_", "PYSPARK_", "AWS_", "PIP_")


@dataclass(frozen=True)
class Block:
    """One fenced block of the page: its info string, its text, and its line on the page."""

    lang: str
    text: str
    line: int


def blocks(text: str) -> list[Block]:
    """Every fenced block of a markdown text, in order."""
    found: list[Block] = []
    current: list[str] | None = None
    lang, start = "", 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if line.startswith("```"):
            if current is None:
                current, lang, start = [], line[3:].strip(), number
            else:
                found.append(Block(lang, "".join(current), start))
                current = None
        elif current is not None:
            current.append(line)
    assert current is None, "an unclosed fence"
    return found


def user_env(bootstrap_servers: str) -> dict[str, str]:
    """A user's shell after ``source .venv/bin/activate``, reaching the given broker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    env["INORDER_KAFKA_BOOTSTRAP_SERVERS"] = bootstrap_servers
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run_block(block: Block, work: Path, env: dict[str, str]) -> str:
    """Run one block (bash or python) in ``work``; its stdout. Fails on a non-zero exit."""
    if block.lang == "bash":
        command, stdin = ["bash", "-e", "-c", block.text], ""
    else:
        command, stdin = ["python", "-"], block.text
    done = subprocess.run(
        command,
        input=stdin,
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, (
        f"docs/tables.md line {block.line} ({block.lang}) exited {done.returncode}:\n"
        f"{block.text}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
    return done.stdout


def delta_rows(path: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    """The rows of a Delta table (only ``columns``), sorted, as plain Python values."""
    table = DeltaTable(str(path)).to_pyarrow_table(columns=columns)
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def as_of_truth(changes: pa.Table) -> dict[str, Any]:
    """The page's session as of the page's offset, from the change log alone."""
    mask = pc.and_(
        pc.and_(
            pc.equal(changes.column("topic"), AS_OF_TOPIC),
            pc.equal(changes.column("session"), AS_OF_SESSION),
        ),
        pc.less_equal(changes.column("offset"), AS_OF_OFFSET),
    )
    tables = rebuild_tables(changes.filter(mask))
    return dict(tables[(AS_OF_TOPIC, AS_OF_SESSION)])


@pytest.mark.timeout(900)
def test_tables_doc_verbatim(kafka: KafkaService, tmp_path: Path) -> None:
    if kafka.external:
        pytest.skip("the page's fixed topic names need a broker of this test session")
    page = blocks(DOC.read_text(encoding="utf-8"))
    runnable = [i for i, b in enumerate(page) if b.lang in ("bash", "python")]
    langs = [page[i].lang for i in runnable]
    assert langs.count("bash") == 2 and langs.count("python") >= 7, langs
    work = tmp_path / "w"
    work.mkdir()
    env = user_env(kafka.bootstrap_servers)

    printed: list[str] = []
    checked: set[str] = set()
    for i in runnable:
        block = page[i]
        out = run_block(block, work, env)
        if block.lang == "python" and out:
            shown = page[i + 1] if i + 1 < len(page) else None
            assert shown is not None and shown.lang == "", (
                f"line {block.line}: the block prints, but no output block follows it:\n{out}"
            )
            assert out == shown.text, (
                f"line {block.line}: printed\n{out}\nthe page shows (line {shown.line})\n"
                f"{shown.text}"
            )
            printed.append(out)
        if block.lang == "bash" and "inorder run tables.toml\n" in block.text:
            check_delta_tables(work)
            checked.add("delta")
        if "optimize.compact()" in block.text:
            # Compaction and vacuum leave the rows as they were.
            check_delta_tables(work)
            checked.add("compaction")
        if block.lang == "bash" and "tables.format=iceberg" in block.text:
            check_iceberg_tables(work)
            checked.add("iceberg")
    assert checked == {"delta", "compaction", "iceberg"}, checked
    assert len(printed) == 4, printed

    # What the page shows agrees with the change log (not only with what its blocks print).
    changes = DeltaTable(str(work / TABLES / "changes")).to_pyarrow_table()
    live = sum(len(rows) for rows in rebuild_tables(changes).values())
    versions = sum(op in ("insert", "update") for op in changes.column("op").to_pylist())
    assert printed[0] == f"{live} current rows\n{live} open versions of {versions}\n"
    truth = as_of_truth(changes)
    assert truth, "the page's as-of query must find rows"
    shown_rows = {}
    for line in printed[1].splitlines():
        row_id, row = line.split(" ", 1)
        shown_rows[row_id] = json.loads(row)
    assert shown_rows == truth
    assert printed[2] == f"{sorted(truth)!r}\n"
    assert printed[3] == f"{live} current rows\n{sorted(truth)!r}\n"


def check_delta_tables(work: Path) -> None:
    """The Delta tables hold what the change log gives."""
    changes = DeltaTable(str(work / TABLES / "changes")).to_pyarrow_table()
    assert changes.num_rows > 0
    rebuilt = sorted(
        (topic, session, row_id, row)
        for (topic, session), rows in rebuild_tables(changes).items()
        for row_id, row in rows.items()
    )
    key = ["topic", "session", "row_id", "row"]
    current = [
        (t, s, r, json.loads(v)) for t, s, r, v in delta_rows(work / TABLES / "current", key)
    ]
    assert current == rebuilt
    history = DeltaTable(str(work / TABLES / "history")).to_pyarrow_table()
    open_versions = history.filter(pc.field("is_current"))
    assert sorted(
        zip(*(open_versions.column(c).to_pylist() for c in key), strict=True)
    ) == delta_rows(work / TABLES / "current", key)
    opened = changes.filter(pc.is_in(changes.column("op"), pa.array(["insert", "update"])))
    assert sorted(
        zip(*(history.column(c).to_pylist() for c in [*key, "valid_from_offset"]), strict=True)
    ) == sorted(zip(*(opened.column(c).to_pylist() for c in [*key, "offset"]), strict=True))


def check_iceberg_tables(work: Path) -> None:
    """The Iceberg tables hold the Delta tables' rows, in the catalog named ``inorder`` only."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    warehouse = (work / WAREHOUSE).resolve()
    props = {"uri": f"sqlite:///{warehouse}/catalog.db", "warehouse": warehouse.as_uri()}
    catalog = SqlCatalog("inorder", **props)
    key = ["topic", "session", "row_id", "row"]
    for name in ("current", "history"):
        table = catalog.load_table(f"sessions.{name}").scan().to_arrow()
        got = sorted(zip(*(table.column(c).to_pylist() for c in key), strict=True))
        assert got == delta_rows(work / TABLES / name, key), name
    with pytest.raises(NoSuchTableError):
        SqlCatalog("default", **props).load_table("sessions.current")
