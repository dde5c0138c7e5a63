"""The status page's per-partition tables, paginated: a pipeline reads one topic per site,
often 1,000 and more, and a table of every topic-partition made a page of megabytes.

Each table shows :data:`PAGE_ROWS` rows of the page asked for (``?page=N``, in topic-partition
order). Above them a summary counts topics and partitions and names, on every page, the
partitions that need a look: behind (lag > 0, the furthest first), with integrity events,
with ignored records, without a committed state version; the first few are named and the
rest counted, never dropped. ``status.json`` keeps every partition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from inorder.listing import named, topics_and_partitions
from inorder.ui.html import num, size_bytes, table, timestamp

#: Rows a table shows per page.
PAGE_ROWS = 50


def pages(total: int) -> int:
    """How many pages ``total`` rows fill (at least one)."""
    return max(1, -(-total // PAGE_ROWS))


def page_slice(rows: Sequence[Any], page: int) -> tuple[Sequence[Any], int]:
    """The rows of ``page`` (1-based, clamped to the pages there are) and that page."""
    page = min(max(page, 1), pages(len(rows)))
    start = (page - 1) * PAGE_ROWS
    return rows[start : start + PAGE_ROWS], page


def _nav(total: int, page: int) -> str:
    """``rows 51-100 of 4,000 · page 2 of 80`` with links to the pages around it."""
    count = pages(total)
    if count == 1:
        return ""
    first = (page - 1) * PAGE_ROWS + 1
    last = min(page * PAGE_ROWS, total)
    links = []
    for label, target in (
        ("first", 1),
        ("previous", page - 1),
        ("next", page + 1),
        ("last", count),
    ):
        if 1 <= target <= count and target != page:
            links.append(f'<a href="?page={target}" data-page="{target}">{label}</a>')
    return (
        f'<p class="note" data-field="pages">rows {first:,}&ndash;{last:,} of {total:,} · '
        f"page {page:,} of {count:,} " + " · ".join(links) + "</p>"
    )


def _tp(p: Mapping[str, Any]) -> str:
    return f"{p['topic']}[{p['partition']}]"


def attention(parts: Sequence[Mapping[str, Any]]) -> list[str]:
    """What needs a look, partition by partition: lines naming the first few of each kind."""
    out = []
    behind = sorted((p for p in parts if p["lag"]), key=lambda p: -p["lag"])
    if behind:
        total = sum(p["lag"] for p in behind)
        out.append(
            f"{len(behind):,} behind ({total:,} records): "
            + named([f"{_tp(p)} ({p['lag']:,})" for p in behind])
        )
    for field, what in (
        ("events", "with integrity events"),
        ("resets", "with session resets"),
        ("ignored", "ignoring records of reset sessions"),
    ):
        hit = sorted((p for p in parts if p[field]), key=lambda p: -p[field])
        if hit:
            out.append(f"{len(hit):,} {what}: " + named([f"{_tp(p)} ({p[field]:,})" for p in hit]))
    return out


def partitions_section(doc: Mapping[str, Any], page: int = 1) -> str:
    """The topic-partitions table: a summary, then the rows of ``page``."""
    head = [
        ("topic-partition", False),
        ("committed offset", True),
        ("end offset", True),
        ("lag", True),
        ("records/s", True),
        ("last batch with records", False),
        ("state keys", True),
        ("state bytes", True),
        ("integrity events", True),
        ("session resets", True),
        ("ignored since", True),
    ]
    parts = doc["partitions"]
    shown, page = page_slice(parts, page)
    rows, attrs = [], []
    for p in shown:
        tp = _tp(p)
        attrs.append(f' data-tp="{escape(tp)}"')
        rows.append(
            [
                f"<code>{escape(tp)}</code>",
                f'<span data-field="committed">{num(p["committed"])}</span>',
                f'<span data-field="end">{num(p["end_offset"])}</span>',
                f'<span data-field="lag">{num(p["lag"])}</span>',
                num(p["records_per_second"]),
                timestamp(p["last_batch_at"]),
                f'<span data-field="keys">{num(p["state_keys"])}</span>',
                size_bytes(p["state_bytes"]),
                f'<span class="{"bad" if p["events"] else ""}">{num(p["events"])}</span>',
                num(p["resets"]),
                f'<span class="{"bad" if p["ignored"] else ""}" data-field="ignored">'
                f"{num(p['ignored'])}</span>",
            ]
        )
    note = ""
    if doc["broker"] != "reachable":
        note = (
            f'<p class="note">{escape(doc["broker"])}: end offsets unknown; the lag shown is '
            "the one the last recorded batch saw.</p>"
        )
    summary = ""
    if len(parts) > PAGE_ROWS:
        looks = attention(parts)
        summary = (
            f'<p data-field="partition-summary">{escape(topics_and_partitions(map(_tp, parts)))}'
            + "".join(f'<br><span class="bad">{escape(line)}</span>' for line in looks)
            + ("" if looks else "; none behind, none with integrity events or resets")
            + "</p>"
        )
    return (
        "<section><h2>Topic-partitions<small>records/s: the last 10 committed batches' "
        f"records over the time they ran</small></h2>{summary}{_nav(len(parts), page)}"
        f"{table(head, rows, attrs)}{note}</section>"
    )


def ignored_lines(doc: Mapping[str, Any]) -> str:
    """One line per partition whose reset sessions had later records ignored (the first
    :data:`PAGE_ROWS`; the rest counted)."""
    first: dict[str, int] = {}
    for e in doc["resets"]:  # newest first: the last one seen is the oldest reset shown
        first[f"{e['topic']}[{e['partition']}]"] = e["first_offset"]
    lines = [
        f"<code>{escape(tp)}</code>: {p['ignored']:,} later records of reset sessions ignored"
        + (f" since offset {first[tp]:,}" if tp in first else "")
        for p in doc["partitions"]
        if p["ignored"]
        for tp in [_tp(p)]
    ]
    if not lines:
        return ""
    rest = len(lines) - PAGE_ROWS
    if rest > 0:
        lines = [*lines[:PAGE_ROWS], f"and {rest:,} more partitions (status.json lists each)"]
    return '<p class="bad" data-field="ignored-since">' + "<br>".join(lines) + "</p>"


def _state_summary(state: Sequence[Mapping[str, Any]]) -> str:
    if len(state) <= PAGE_ROWS:
        return ""
    files = size_bytes(sum(s["file_bytes"] for s in state))
    if all(s.get("loaded", True) for s in state):
        keys = sum(s["keys"] for s in state)
        state_bytes = size_bytes(sum(s["state_bytes"] for s in state))
        sizes = f"{keys:,} keys, {state_bytes} state, {files} files"
    else:
        sizes = (
            f"{files} files; keys and state bytes not opened at this many partitions "
            "(inorder inspect --state --topic T opens a topic's)"
        )
    text = f"{topics_and_partitions(map(_tp, state))}: {sizes}"
    missing = [_tp(s) for s in state if s["version"] is None]
    extra = ""
    if missing:
        extra = f'<br><span class="bad">{len(missing):,} without a committed version: '
        extra += f"{escape(named(missing))}</span>"
    return f'<p data-field="state-summary">{escape(text)}{extra}</p>'


def state_and_output(doc: Mapping[str, Any], page: int = 1) -> str:
    """The state table (the rows of ``page``) beside the output's facts."""
    head = [
        ("topic-partition", False),
        ("version", True),
        ("keys", True),
        ("ignored keys", True),
        ("state bytes", True),
        ("file bytes", True),
        ("last offset", True),
    ]
    shown, page = page_slice(doc["state"], page)
    rows = [
        [
            f"<code>{escape(s['topic'])}[{s['partition']}]</code>",
            num(s["version"]),
            num(s["keys"]),
            num(s["ignored_keys"]),
            size_bytes(s["state_bytes"]),
            size_bytes(s["file_bytes"]),
            num(s["last_offset"]),
        ]
        for s in shown
    ]
    out = doc["output"]
    facts = [
        ("kind", f'<span id="out-kind">{escape(out["kind"])}</span>'),
        ("location", f"<code>{escape(out['location'])}</code>"),
        ("committed files", f'<span id="out-files">{num(out["files"])}</span>'),
        ("rows", num(out["rows"])),
        ("size", size_bytes(out["bytes"])),
    ]
    if out.get("compaction"):
        facts.append(
            ("compaction", f'<span id="out-compaction">{escape(out["compaction"])}</span>')
        )
    output = (
        "<table><tbody>"
        + "".join(f'<tr><th>{escape(k)}</th><td class="wrap">{v}</td></tr>' for k, v in facts)
        + "</tbody></table>"
    )
    note = f'<p class="note">{escape(out["note"])}</p>' if out.get("note") else ""
    return (
        '<div class="grid2">'
        f"<section><h2>State<small>per partition, newest committed version</small></h2>"
        f"{_state_summary(doc['state'])}{_nav(len(doc['state']), page)}"
        f"{table(head, rows)}</section>"
        f"<section><h2>Output</h2>{output}{note}</section></div>"
    )
