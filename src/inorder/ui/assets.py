"""The page's style sheet and its one small script, inlined (the page loads nothing else)."""

from __future__ import annotations

CSS = """
:root { --fg:#1f2933; --muted:#616e7c; --line:#e4e7eb; --bg:#f5f7fa; --card:#fff;
  --ok:#2f8a4c; --warn:#c77700; --bad:#c0392b; --accent:#4e79a7; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
  color:var(--fg); background:var(--bg); }
header { background:#1f2933; color:#fff; padding:12px 24px; display:flex; gap:16px;
  align-items:baseline; flex-wrap:wrap; }
header h1 { font-size:18px; margin:0; font-weight:600; }
header .meta { color:#cbd2d9; font-size:13px; }
header .right { margin-left:auto; font-size:12px; color:#cbd2d9; }
main { padding:16px 24px 32px; max-width:1400px; margin:0 auto; }
section { background:var(--card); border:1px solid var(--line); border-radius:6px;
  padding:12px 16px; margin:0 0 16px; }
section h2 { font-size:15px; margin:0 0 8px; font-weight:600; }
section h2 small { color:var(--muted); font-weight:400; margin-left:6px; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(130px,1fr)); gap:12px;
  margin:0 0 16px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:6px;
  padding:10px 12px; }
.card .label { color:var(--muted); font-size:12px; }
.card .value { font-size:20px; font-weight:600; font-variant-numeric:tabular-nums; }
.grid2, .grid3 { display:grid; gap:16px; margin:0 0 16px; }
.grid2 { grid-template-columns:minmax(0,3fr) minmax(0,2fr); }
@media (max-width: 900px) { .grid2 { grid-template-columns:1fr; } }
.grid3 { grid-template-columns:repeat(auto-fit,minmax(340px,1fr)); }
.grid2 section, .grid3 section { margin:0; }
td.wrap { white-space:normal; word-break:break-all; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line);
  white-space:nowrap; }
th { color:var(--muted); font-weight:500; font-size:12px; }
td.num, th.num { text-align:right; }
.scroll { max-height:320px; overflow:auto; }
code { font:12px ui-monospace,SFMono-Regular,Menlo,monospace; background:#f0f2f5;
  padding:1px 4px; border-radius:3px; }
pre { font:12px ui-monospace,SFMono-Regular,Menlo,monospace; background:#f0f2f5;
  padding:8px; border-radius:4px; overflow:auto; max-height:360px; margin:0; }
.badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px;
  font-weight:600; color:#fff; }
.badge.ok { background:var(--ok); } .badge.idle { background:#7b8794; }
.badge.warn { background:var(--warn); } .badge.bad { background:var(--bad); }
.bad { color:var(--bad); font-weight:600; } .running { color:var(--ok); font-weight:600; }
.pending { color:var(--warn); } .muted, .empty { color:var(--muted); }
svg.chart { width:100%; height:auto; display:block; }
svg .grid { stroke:var(--line); } svg .tick { fill:var(--muted); font-size:10px; }
svg .line { fill:none; stroke-width:1.8; } svg .hover { fill:transparent; }
svg .hover:hover { fill:rgba(31,41,51,.06); }
.legend { display:flex; gap:12px; flex-wrap:wrap; font-size:12px; color:var(--muted);
  margin:0 0 4px; }
.legend i { display:inline-block; width:10px; height:10px; border-radius:2px;
  margin-right:4px; vertical-align:-1px; }
.note { color:var(--muted); font-size:12px; margin:6px 0 0; }
"""

#: Replaces the live part of the page with a fresh rendering every few seconds; a failed
#: fetch keeps what is shown and says so. Nothing runs while the tab is hidden.
SCRIPT = """
(function () {
  var live = document.getElementById('live');
  var state = document.getElementById('updated');
  var every = Number(live.dataset.every || 3000);
  var pending = false;
  function tick() {
    if (pending || document.hidden) { return; }
    pending = true;
    fetch(live.dataset.src, {credentials: 'same-origin', cache: 'no-store'})
      .then(function (r) { if (!r.ok) { throw new Error('HTTP ' + r.status); } return r.text(); })
      .then(function (html) {
        live.innerHTML = html;
        live.dataset.updates = String(Number(live.dataset.updates || 0) + 1);
        state.textContent = 'updated ' + new Date().toLocaleTimeString();
        state.className = 'right';
      })
      .catch(function (e) { state.textContent = 'update failed (' + e.message + ')'; })
      .then(function () { pending = false; });
  }
  setInterval(tick, every);
})();
"""
