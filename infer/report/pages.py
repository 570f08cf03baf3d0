"""HTML of the report's pages. Every string that comes from a trajectory, a model answer or a config
passes through :func:`esc` (or, for the index's table, JSON that the script puts in with textContent),
so a task holding ``<script>`` shows as text. Links and images are relative to the report folder."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable

from keyshot.infer.metrics.compute import ARB_ANNOTATION, HUMAN_LABELS, MetricsReport
from keyshot.infer.metrics.files import percent, truth_source, truth_sr_column


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def page(title: str, body: str, *, root: str = ".", subtitle: str = "") -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<link rel="stylesheet" href="{root}/static/report.css">
</head><body>
<header><h1>{esc(title)}</h1><div class="sub">{subtitle}</div></header>
<main>
{body}
</main>
<div id="lightbox"><img alt="screenshot"></div>
<script src="{root}/static/report.js"></script>
</body></html>
"""


def cards(items: Iterable[tuple[str, object]]) -> str:
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="n">{esc(n)}</div><div class="l">{esc(label)}</div></div>'
            for label, n in items
        )
        + "</div>"
    )


def key_values(items: Iterable[tuple[str, object]]) -> str:
    rows = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in items if v not in (None, ""))
    return f'<table class="kv">{rows}</table>'


def table(header: list[str], rows: Iterable[list[object]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(
        f'<th class="num">{esc(h)}</th>' if i in numeric else f"<th>{esc(h)}</th>"
        for i, h in enumerate(header)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{esc(c)}</td>' if i in numeric else f"<td>{esc(c)}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def metrics_tables(report: MetricsReport | None) -> str:
    if report is None:
        return '<p class="muted">No ground truth in this run (no human labels, no benchmark reward): pass --human-labels to compare.</p>'
    agreement = table(
        [
            "scope",
            "group",
            "n",
            "no status",
            "keyshot SR %",
            f"{truth_sr_column(report)} %",
            "agreement %",
            "SR gap",
        ],
        [
            [
                r.scope,
                r.group,
                r.n,
                r.n_no_verdict,
                percent(r.judge_sr),
                percent(r.human_sr),
                percent(r.agreement),
                percent(r.sr_gap),
            ]
            for r in report.agreement
        ],
        numeric={2, 3, 4, 5, 6, 7},
    )
    classification = table(
        ["scope", "group", "n", "TP", "FP", "FN", "TN", "precision %", "recall %", "F1 %"],
        [
            [
                r.scope,
                r.group,
                r.n,
                r.tp,
                r.fp,
                r.fn,
                r.tn,
                percent(r.precision),
                percent(r.recall),
                percent(r.f1),
            ]
            for r in report.classification
        ],
        numeric={2, 3, 4, 5, 6, 7, 8, 9},
    )
    dropped = ", ".join(f"{k}: {v}" for k, v in report.dropped.items()) or "none"
    label_2 = (
        f"human label 2 (not executable) counts as {esc(report.label_2)}; "
        if HUMAN_LABELS in report.truth or ARB_ANNOTATION in report.truth
        else ""
    )
    return (
        "".join(f'<div class="banner">{esc(note)}</div>' for note in report.notes)
        + f'<p class="muted">{report.n_used} of {report.n_records} trajectories are compared with their truth '
        f"({esc(truth_source(report))}; dropped: {esc(dropped)}); "
        f"{label_2}a verdict without a status counts as failure.</p>"
        f'<div class="grid2"><div><h3>Agreement and success rates</h3>{agreement}</div>'
        f"<div><h3>Precision / recall / F1 (success is positive)</h3>{classification}</div></div>"
    )


def json_script(element_id: str, data: object) -> str:
    """JSON in a ``<script type="application/json">`` that no string can break out of."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script id="{element_id}" type="application/json">{text}</script>'


TRAJECTORY_TABLE = """
<div class="controls">
  <button data-filter="all">all</button>
  <button data-filter="disagree">disagreements with ground truth</button>
  <button data-filter="unreadable">verdicts without a status</button>
  <button data-filter="incomplete">no readable scores or failed calls</button>
  <button data-filter="apart">not executable / infrastructure</button>
  <select id="agent"><option value="">every agent</option></select>
  <input id="search" type="search" placeholder="search task or id">
  <span id="count" class="muted"></span>
</div>
<table id="trajectories">
  <thead><tr>
    <th data-key="agent">agent</th><th data-key="task_id">task id</th><th data-key="run">run</th>
    <th data-key="task">task</th><th data-key="verdict">keyshot</th>
    <th data-key="truth">ground truth</th><th data-key="agree">agrees</th><th data-key="kind">kind</th>
    <th data-key="shots" class="num">screenshots</th><th data-key="kept" class="num">kept</th>
    <th data-key="cost" class="num">cost $</th>
  </tr></thead>
  <tbody></tbody>
</table>
<div class="pager"><button id="prev">◀</button><span id="page"></span><button id="next">▶</button></div>
"""
