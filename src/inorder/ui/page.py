"""The status page as HTML: the whole page, and its live part alone (what the page fetches
every few seconds to update itself without a reload). Every value is escaped."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

from inorder.ui.assets import CSS, SCRIPT
from inorder.ui.charts import lines, stacked_bars

#: The duration split of the batch chart: label -> the ``seconds`` keys it sums.
PHASES: dict[str, tuple[str, ...]] = {
    "read (input wait)": ("read",),
    "apply": ("apply",),
    "state": ("load", "state"),
    "write": ("write",),
    "commit": ("commit",),
    "planning": (
        "spark_latestOffset",
        "spark_getBatch",
        "spark_queryPlanning",
        "spark_walCommit",
        "spark_commitOffsets",
    ),
}


def _n(value: Any) -> str:
    if value is None:
        return '<span class="muted">&ndash;</span>'
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def _bytes(value: int | None) -> str:
    if value is None:
        return _n(None)
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TiB"


def _time(value: str | None) -> str:
    if not value:
        return _n(None)
    return f'<time datetime="{escape(value)}">{escape(value.replace("T", " ")[:19])}</time>'


def _table(
    head: Sequence[tuple[str, bool]], rows: Iterable[Sequence[str]], row_attrs: Sequence[str] = ()
) -> str:
    """A table; ``head`` is (title, numeric); cells are already HTML."""
    cells = "".join(f'<th class="{"num" if num else ""}">{escape(t)}</th>' for t, num in head)
    body = []
    for i, row in enumerate(rows):
        attrs = row_attrs[i] if i < len(row_attrs) else ""
        tds = "".join(
            f'<td class="{"num" if head[j][1] else ""}">{cell}</td>' for j, cell in enumerate(row)
        )
        body.append(f"<tr{attrs}>{tds}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(head)}" class="empty">none</td></tr>')
    return f'<div class="scroll"><table><thead><tr>{cells}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'  # noqa: E501


def _card(label: str, value: str, ident: str) -> str:
    return (
        f'<div class="card"><div class="label">{escape(label)}</div>'
        f'<div class="value" id="{ident}">{value}</div></div>'
    )


def _cards(doc: Mapping[str, Any]) -> str:
    parts = doc["partitions"]
    lags = [p["lag"] for p in parts if p["lag"] is not None]
    rates = [p["records_per_second"] for p in parts if p["records_per_second"] is not None]
    events = sum(e["count"] for e in doc["events"])
    out = doc["output"]
    return (
        '<div class="cards">'
        + "".join(
            [
                _card("last committed batch", _n(doc["last_committed_batch"]), "last-batch"),
                _card("batches in the log", _n(doc["batches_in_log"]), "batch-count"),
                _card("lag (records)", _n(sum(lags)) if lags else _n(None), "total-lag"),
                _card("records/s", _n(round(sum(rates), 1)) if rates else _n(None), "total-rate"),
                _card("state keys", _n(sum(s["keys"] for s in doc["state"])), "state-keys"),
                _card("output rows", _n(out.get("rows")), "output-rows"),
                _card("output files", _n(out.get("files")), "output-files"),
                _card(
                    "integrity events",
                    f'<span class="{"bad" if events else ""}">{events:,}</span>',
                    "event-count",
                ),
            ]
        )
        + "</div>"
    )


def _partitions(doc: Mapping[str, Any]) -> str:
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
    rows, attrs = [], []
    for p in doc["partitions"]:
        tp = f"{p['topic']}[{p['partition']}]"
        attrs.append(f' data-tp="{escape(tp)}"')
        rows.append(
            [
                f"<code>{escape(tp)}</code>",
                f'<span data-field="committed">{_n(p["committed"])}</span>',
                f'<span data-field="end">{_n(p["end_offset"])}</span>',
                f'<span data-field="lag">{_n(p["lag"])}</span>',
                _n(p["records_per_second"]),
                _time(p["last_batch_at"]),
                f'<span data-field="keys">{_n(p["state_keys"])}</span>',
                _bytes(p["state_bytes"]),
                f'<span class="{"bad" if p["events"] else ""}">{_n(p["events"])}</span>',
                _n(p["resets"]),
                f'<span class="{"bad" if p["ignored"] else ""}" data-field="ignored">'
                f"{_n(p['ignored'])}</span>",
            ]
        )
    note = ""
    if doc["broker"] != "reachable":
        note = (
            f'<p class="note">{escape(doc["broker"])}: end offsets unknown; the lag shown is '
            "the one the last recorded batch saw.</p>"
        )
    return (
        "<section><h2>Topic-partitions<small>records/s: the last 10 committed batches' "
        f"records over the time they ran</small></h2>{_table(head, rows, attrs)}{note}</section>"
    )


def _charts(doc: Mapping[str, Any]) -> str:
    batches = [b for b in doc["batches"] if b["committed"]]
    xs = [b["batch_id"] for b in batches]
    phases = {
        label: [sum(b["seconds"].get(k, 0.0) for k in keys) for b in batches]
        for label, keys in PHASES.items()
    }
    if not any(any(v) for v in phases.values()):
        split = lines(xs, {"duration": [b["duration_seconds"] for b in batches]}, " s", "batch")
        note = (
            '<p class="note">No recorded split for these batches (they ran without the batch '
            "history: runs of <code>inorder run</code> record it); planned to committed time "
            "shown.</p>"
        )
    else:
        split = stacked_bars(xs, phases, " s", "batch duration split")
        note = (
            '<p class="note">Task phases are summed over the partitions of a batch, so a bar '
            "can exceed the batch's wall time when tasks ran in parallel.</p>"
        )
    records = lines(
        xs,
        {
            "records": [float(b["records"]) for b in batches],
            "output rows": [b["output_rows"] for b in batches],
        },
        "",
        "records and output rows per batch",
    )
    files = lines(xs, {"output files": [b["output_files"] for b in batches]}, "", "files")
    return (
        '<div class="grid3">'
        f"<section><h2>Batch duration split<small>seconds</small></h2>{split}{note}</section>"
        f"<section><h2>Records and output rows<small>per batch</small></h2>{records}</section>"
        f"<section><h2>Output files<small>per batch</small></h2>{files}</section>"
        f"</div>{_batch_table(doc)}"
    )


#: How each batch state reads, and its class: only a fault is red, and an interrupted
#: batch is none (the next start re-runs it; its output is still written once).
_STATES = {
    "committed": ("committed", ""),
    "running": ("running", "running"),
    "interrupted": ("interrupted: re-run at the next start", "pending"),
    "not committed": ("not committed yet", "pending"),
}


def _batch_state(b: Mapping[str, Any]) -> str:
    text, css = _STATES.get(b.get("state") or "", (str(b.get("state")), ""))
    if b.get("output_committed"):
        # The sink commits before Spark does: the rows shown are in the output already.
        text += " · output committed"
    cell = f'<span class="{css}" data-field="state">{escape(text)}</span>'
    return cell


def _batch_table(doc: Mapping[str, Any]) -> str:
    head = [
        ("batch", True),
        ("state", False),
        ("planned", False),
        ("seconds", True),
        ("records", True),
        ("output rows", True),
        ("files", True),
        ("integrity events", True),
    ]
    rows, attrs = [], []
    for b in reversed(doc["batches"]):
        events = sum(b["violations"].values())
        attrs.append(f' data-batch="{int(b["batch_id"])}"')
        rows.append(
            [
                _n(b["batch_id"]),
                _batch_state(b),
                _time(b["planned_at"]),
                _n(b["duration_seconds"]),
                _n(b["records"]),
                f'<span data-field="output-rows">{_n(b["output_rows"])}</span>',
                _n(b["output_files"]),
                f'<span class="{"bad" if events else ""}">{events:,}</span>',
            ]
        )
    table = _table(head, rows, attrs)
    return f"<section><h2>Batches<small>newest first</small></h2>{table}</section>"


def _events(doc: Mapping[str, Any]) -> str:
    head = [
        ("batch", True),
        ("topic-partition", False),
        ("rule", False),
        ("count", True),
        ("offsets", False),
        ("step through it", False),
    ]

    def row(e: Mapping[str, Any]) -> list[str]:
        first, last = e["first_offset"], e["last_offset"]
        span = _n(first) if first == last else f"{_n(first)} … {_n(last)}"
        rule = escape(e["rule"]) + (f" <code>{escape(e['key'])}</code>" if e.get("key") else "")
        return [
            _n(e["batch_id"]),
            f"<code>{escape(e['topic'])}[{e['partition']}]</code>",
            rule,
            _n(e["count"]),
            span,
            f"<code>{escape(e['replay'])}</code>",
        ]

    note = ""
    if not doc["history_recorded"]:
        note = (
            '<p class="note">No batch history recorded in this checkpoint: integrity events '
            "are counted by <code>inorder run</code> runs.</p>"
        )
    return (
        "<section><h2>Integrity events<small>by batch, partition and rule; offsets: the "
        f"batch's range</small></h2>{_table(head, [row(e) for e in doc['events']])}{note}"
        "</section><section><h2>Session resets<small>newest first; rule: the session"
        f"</small></h2>{_ignored(doc)}{_table(head, [row(e) for e in doc['resets']])}</section>"
    )


def _ignored(doc: Mapping[str, Any]) -> str:
    """One line per partition whose reset sessions had later records ignored."""
    first: dict[str, int] = {}
    for e in doc["resets"]:  # newest first: the last one seen is the oldest reset shown
        first[f"{e['topic']}[{e['partition']}]"] = e["first_offset"]
    lines = [
        f"<code>{escape(tp)}</code>: {p['ignored']:,} later records of reset sessions ignored"
        + (f" since offset {first[tp]:,}" if tp in first else "")
        for p in doc["partitions"]
        if p["ignored"]
        for tp in [f"{p['topic']}[{p['partition']}]"]
    ]
    if not lines:
        return ""
    return '<p class="bad" data-field="ignored-since">' + "<br>".join(lines) + "</p>"


def _state_and_output(doc: Mapping[str, Any]) -> str:
    head = [
        ("topic-partition", False),
        ("version", True),
        ("keys", True),
        ("ignored keys", True),
        ("state bytes", True),
        ("file bytes", True),
        ("last offset", True),
    ]
    rows = [
        [
            f"<code>{escape(s['topic'])}[{s['partition']}]</code>",
            _n(s["version"]),
            _n(s["keys"]),
            _n(s["ignored_keys"]),
            _bytes(s["state_bytes"]),
            _bytes(s["file_bytes"]),
            _n(s["last_offset"]),
        ]
        for s in doc["state"]
    ]
    out = doc["output"]
    facts = [
        ("kind", f'<span id="out-kind">{escape(out["kind"])}</span>'),
        ("location", f"<code>{escape(out['location'])}</code>"),
        ("committed files", f'<span id="out-files">{_n(out["files"])}</span>'),
        ("rows", _n(out["rows"])),
        ("size", _bytes(out["bytes"])),
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
        f"{_table(head, rows)}</section>"
        f"<section><h2>Output</h2>{output}{note}</section></div>"
    )


def _status_badge(doc: Mapping[str, Any]) -> str:
    running = doc["running"]
    if running is True:
        return '<span class="badge ok" id="run-state">running</span>'
    if running is False:
        return '<span class="badge idle" id="run-state">stopped</span>'
    return '<span class="badge warn" id="run-state">unknown</span>'


def render_live(doc: Mapping[str, Any]) -> str:
    """The part of the page that changes: refetched and swapped in every few seconds."""
    return (
        f'<p class="muted">{_status_badge(doc)} checkpoint <code>{escape(doc["checkpoint"])}'
        f"</code> · broker {escape(doc['broker'])}</p>"
        + _cards(doc)
        + _partitions(doc)
        + _charts(doc)
        + _events(doc)
        + _state_and_output(doc)
    )


def render_page(doc: Mapping[str, Any], live_src: str, every_ms: int) -> str:
    """The whole page: header, live part, configuration."""
    config = json.dumps(doc["config"], indent=2, sort_keys=True, default=str)
    title = f"{doc['pipeline']} · inorder"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{escape(title)}</title><style>{CSS}</style></head>
<body><header><h1>{escape(doc["pipeline"])}</h1>
<span class="meta">{escape(doc["reference"])} · inorder {escape(doc["version"])}</span>
<span class="right" id="updated">live: updates every {every_ms / 1000:g} s</span></header>
<main><div id="live" data-src="{escape(live_src)}" data-every="{every_ms}" data-updates="0">
{render_live(doc)}</div>
<section><h2>Configuration<small>secrets masked</small></h2><pre id="config">{escape(config)}</pre>
</section></main><script>{SCRIPT}</script></body></html>"""
