"""The status page as HTML: the whole page, and its live part alone (what the page fetches
every few seconds to update itself without a reload). Every value is escaped."""

from __future__ import annotations

import json
from collections.abc import Mapping
from html import escape
from typing import Any

from inorder.ui.assets import CSS, SCRIPT
from inorder.ui.charts import lines, stacked_bars
from inorder.ui.html import num, table, timestamp
from inorder.ui.partitions import ignored_lines, partitions_section, state_and_output

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


def _card(label: str, value: str, ident: str) -> str:
    return (
        f'<div class="card"><div class="label">{escape(label)}</div>'
        f'<div class="value" id="{ident}">{value}</div></div>'
    )


def _state_keys(doc: Mapping[str, Any]) -> str:
    """The state's keys: summed over the partitions when each was opened, else the run's
    count at its newest recorded batch."""
    state = doc["state"]
    if all(s.get("loaded", True) for s in state):
        return num(sum(s["keys"] for s in state))
    return num(doc.get("state_keys"))


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
                _card("last committed batch", num(doc["last_committed_batch"]), "last-batch"),
                _card("batches in the log", num(doc["batches_in_log"]), "batch-count"),
                _card("lag (records)", num(sum(lags)) if lags else num(None), "total-lag"),
                _card("records/s", num(round(sum(rates), 1)) if rates else num(None), "total-rate"),
                _card("state keys", _state_keys(doc), "state-keys"),
                _card("output rows", num(out.get("rows")), "output-rows"),
                _card("output files", num(out.get("files")), "output-files"),
                _card(
                    "integrity events",
                    f'<span class="{"bad" if events else ""}">{events:,}</span>',
                    "event-count",
                ),
            ]
        )
        + "</div>"
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
                num(b["batch_id"]),
                _batch_state(b),
                timestamp(b["planned_at"]),
                num(b["duration_seconds"]),
                num(b["records"]),
                f'<span data-field="output-rows">{num(b["output_rows"])}</span>',
                num(b["output_files"]),
                f'<span class="{"bad" if events else ""}">{events:,}</span>',
            ]
        )
    shown = table(head, rows, attrs)
    return f"<section><h2>Batches<small>newest first</small></h2>{shown}</section>"


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
        span = num(first) if first == last else f"{num(first)} … {num(last)}"
        rule = escape(e["rule"]) + (f" <code>{escape(e['key'])}</code>" if e.get("key") else "")
        return [
            num(e["batch_id"]),
            f"<code>{escape(e['topic'])}[{e['partition']}]</code>",
            rule,
            num(e["count"]),
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
        f"batch's range</small></h2>{table(head, [row(e) for e in doc['events']])}{note}"
        "</section><section><h2>Session resets<small>newest first; rule: the session"
        f"</small></h2>{ignored_lines(doc)}{table(head, [row(e) for e in doc['resets']])}</section>"
    )


def _status_badge(doc: Mapping[str, Any]) -> str:
    running = doc["running"]
    if running is True:
        return '<span class="badge ok" id="run-state">running</span>'
    if running is False:
        return '<span class="badge idle" id="run-state">stopped</span>'
    return '<span class="badge warn" id="run-state">unknown</span>'


def render_live(doc: Mapping[str, Any], page: int = 1) -> str:
    """The part of the page that changes: refetched and swapped in every few seconds
    (``page``: which rows of the per-partition tables)."""
    return (
        f'<p class="muted">{_status_badge(doc)} checkpoint <code>{escape(doc["checkpoint"])}'
        f"</code> · broker {escape(doc['broker'])}</p>"
        + _cards(doc)
        + partitions_section(doc, page)
        + _charts(doc)
        + _events(doc)
        + state_and_output(doc, page)
    )


def render_page(doc: Mapping[str, Any], live_src: str, every_ms: int, page: int = 1) -> str:
    """The whole page: header, live part (``page``: which rows of the per-partition
    tables; ``live_src`` fetches the same), configuration."""
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
{render_live(doc, page)}</div>
<section><h2>Configuration<small>secrets masked</small></h2><pre id="config">{escape(config)}</pre>
</section></main><script>{SCRIPT}</script></body></html>"""
