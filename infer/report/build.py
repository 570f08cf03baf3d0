"""Build the report folder: ``index.html``, one page per trajectory, plots, screenshot copies, static files.

OUT/index.html                run config, protocol, counts, metrics, plots, the trajectory table
OUT/trajectories/NNNNN.html   one trajectory: task, key points, every screenshot, the verdict
OUT/images/<sha>.{t,v}.jpg    thumbnails (≤ 320 px) and view copies (≤ 1280 px), cached by content
OUT/plots/*.png, OUT/static/  plots; CSS and JS (no CDN: it opens from disk and any static host)
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

import keyshot.infer.report.plots as plots
from keyshot.infer.common.fileio import write_bytes_atomic, write_text_atomic
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import TrajectoryError
from keyshot.infer.metrics.compute import human_outcome
from keyshot.infer.protocol.parsing import split_key_points
from keyshot.infer.protocol.verdicts import Verdict
from keyshot.infer.report.model import (
    Run,
    ground_truth,
    kind_of,
    load_run,
    metrics_of,
    verdict_word,
)
from keyshot.infer.report.pages import (
    TRAJECTORY_TABLE,
    cards,
    esc,
    json_script,
    key_values,
    metrics_tables,
    page,
    table,
)
from keyshot.infer.report.thumbs import ThumbnailCache

logger = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
PAGES_DIR = "trajectories"
NO_NAME = "—"  # what the trajectory table shows for a verdict that names no agent


def build_report(
    source: Path,
    out: Path,
    *,
    human_labels: dict[tuple[str, str], str] | None = None,
    progress: bool = True,
) -> Path:
    """Write the report of ``source`` (a run folder, verdict file or judge records) into ``out``."""
    run = load_run(source)
    out.mkdir(parents=True, exist_ok=True)
    (out / PAGES_DIR).mkdir(exist_ok=True)
    for name in ("report.css", "report.js"):
        write_bytes_atomic(out / "static" / name, (STATIC / name).read_bytes())
    truths = [ground_truth(v, human_labels) for v in run.verdicts]
    report = metrics_of(run, truths)
    thumbs = ThumbnailCache(out)
    rows = []
    bar = tqdm(total=len(run.verdicts), desc="report", unit="traj", disable=not progress)
    for i, (v, truth) in enumerate(zip(run.verdicts, truths, strict=True)):
        href = f"{PAGES_DIR}/{i:05d}.html"
        kind = kind_of(v, truth)
        word = verdict_word(v)
        agree = None
        if human_outcome(truth) is not None and v.finished:
            agree = bool(v.success) == human_outcome(truth)
        write_text_atomic(out / href, trajectory_page(run, v, i, truth, kind, word, agree, thumbs))
        rows.append(
            {
                "index": i,
                "href": href,
                "agent": v.agent or NO_NAME,
                "benchmark": v.benchmark or "",
                "task_id": v.task_id,
                "task": v.task if len(v.task) <= 160 else v.task[:159] + "…",
                "verdict": word,
                "truth": truth,
                "agree": agree,
                "kind": kind,
                "shots": len(v.screenshots),
                "kept": len(v.kept),
                "cost": round(sum(u.cost_usd for u in v.usage.values()), 6),
            }
        )
        bar.update(1)
    bar.close()
    thumbs.save_index()
    scores = [s.score for v in run.verdicts for s in v.screenshots if not s.call_failed]
    threshold = float(run.protocol.get("threshold", 3) or 3)
    for name, data in (
        ("scores.png", plots.score_histogram(scores, threshold)),
        ("agents.png", plots.agent_success_rates(report)),
        ("confusion.png", plots.confusion_matrix([(r["verdict"], r["truth"]) for r in rows if r["truth"]])),
    ):
        write_bytes_atomic(out / "plots" / name, data)
    write_text_atomic(out / "index.html", index_page(run, rows, report))
    logger.info(
        "report: %d trajectories, %d screenshots converted, %d reused",
        len(rows),
        thumbs.converted,
        thumbs.reused,
    )
    return out / "index.html"


# ---------------------------------------------------------------------------- index
def index_page(run: Run, rows: list[dict], report) -> str:
    words = Counter(r["verdict"] for r in rows)
    kinds = Counter(r["kind"] for r in rows)
    cost = sum(r["cost"] for r in rows)
    counts = cards(
        [
            ("trajectories", len(rows)),
            ("success", words["success"]),
            ("failure", words["failure"]),
            ("verdict without a status", words["no-status"]),
            ("no readable scores", words["no-scores"]),
            ("incomplete (failed calls)", words["incomplete"]),
            ("screenshots", sum(r["shots"] for r in rows)),
            ("kept", sum(r["kept"] for r in rows)),
            ("judge + scorer $", f"{cost:.2f}"),
        ]
    )
    p = run.protocol
    protocol = key_values(
        [
            (
                "prompt set",
                f"{p.get('prompt_variant', p.get('variant', ''))} ({p.get('prompt_version', '')})",
            ),
            ("judge model", p.get("judge_model")),
            (
                "scorer",
                f"{p.get('scorer_model') or 'the judge (reference configuration)'} [{p.get('scorer_backend', '')}]",
            ),
            ("key screenshots", keep_rule_text(p)),
            ("outcome mode", p.get("outcome_mode")),
            ("parse mode", p.get("parse_mode")),
            ("image policy", _policy_text(p.get("image_policy"))),
            ("judge parameters", _judge_params(p)),
            (
                "failed calls",
                "counted as score 0 (--allow-partial)" if p.get("allow_partial") else "trajectory incomplete",
            ),
            ("source", run.source_kind),
        ]
    )
    by_group = []
    for attr in ("agent", "benchmark"):
        groups = Counter(r[attr] for r in rows if r[attr] not in ("", NO_NAME))
        unnamed = len(rows) - sum(groups.values())
        if len(groups) > 1 or attr == "agent":
            by_group.append(
                f"<div><h3>By {attr}</h3>"
                + _unnamed_note(attr, unnamed)
                + table(
                    [attr, "trajectories", "success", "failure", "no verdict", "keyshot SR %"],
                    [
                        [
                            g,
                            n,
                            sum(r[attr] == g and r["verdict"] == "success" for r in rows),
                            sum(r[attr] == g and r["verdict"] == "failure" for r in rows),
                            sum(
                                r[attr] == g and r["verdict"] in ("no-status", "no-scores", "incomplete")
                                for r in rows
                            ),
                            f"{100 * sum(r[attr] == g and r['verdict'] == 'success' for r in rows) / n:.1f}",
                        ]
                        for g, n in sorted(groups.items())
                    ],
                    numeric={1, 2, 3, 4, 5},
                )
                + "</div>"
            )
    apart = table(
        ["kind", "trajectories", "what it means"],
        [
            ["agent", kinds["agent"], "the agent's own outcome"],
            [
                "not executable",
                kinds["not executable"],
                "humans marked the task not executable (Online-Mind2Web label 2)",
            ],
            [
                "infrastructure",
                kinds["infrastructure"],
                "site blocked, CAPTCHA or a crashed run: not the agent's fault",
            ],
            [
                "incomplete",
                kinds["incomplete"],
                "a call failed, or no screenshot score could be read: no verdict; re-run keyshot judge to retry",
            ],
        ],
        numeric={1},
    )
    summary = run.summary.get("run", {})
    unread = [*(summary.get("load_error_messages") or []), *(summary.get("not_trajectory_messages") or [])]
    unread_html = (
        "<h2>Inputs that could not be read (not judged)</h2><ul>"
        + "".join(f"<li>{esc(_no_paths(m))}</li>" for m in unread)
        + "</ul>"
        if unread
        else ""
    )
    body = f"""
<h2>Run</h2>{counts}
<div class="grid2">
<div><h2>Protocol that produced these verdicts</h2>{protocol}</div>
<div><h2>Kinds of outcome</h2>{apart}</div>
</div>
<h2>Agreement with ground truth</h2>{metrics_tables(report)}
<h2>Plots</h2>
<div class="plots"><img src="plots/scores.png" alt="score histogram"><img src="plots/agents.png" alt="success rate per agent">
<img src="plots/confusion.png" alt="confusion matrix"></div>
<div class="grid2">{"".join(by_group)}</div>
{unread_html}
<h2>Trajectories</h2>
{TRAJECTORY_TABLE}
{json_script("rows", rows)}
"""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return page(f"keyshot report: {run.name}", body, subtitle=f"{len(rows)} trajectories · built {stamp}")


def keep_rule_text(p: dict) -> str:
    """The keep rule of the protocol line, each number said: δ on the 1–5 scale and the most kept."""
    on = (
        "expected score (from the scorer's log-probabilities)"
        if p.get("threshold_on") == "expected_score"
        else "score"
    )
    return (
        f"δ = {p.get('threshold')}: a screenshot whose {on} on the 1–5 scale is at least {p.get('threshold')} "
        f"is kept; at most {p.get('max_kept')} screenshots are kept per trajectory for the outcome call"
    )


def _unnamed_note(attr: str, unnamed: int) -> str:
    """What the by-agent (by-benchmark) table leaves out: the trajectories that do not name one."""
    if not unnamed:
        return ""
    how = (
        " (keyshot judge --agent NAME, or keyshot metrics --agent NAME, names them)"
        if attr == "agent"
        else ""
    )
    return f"<p>{unnamed} trajectories name no {attr}: not in this table{how}.</p>"


def _policy_text(policy: dict | None) -> str:
    if not policy:
        return ""
    if not policy.get("resize", True):
        return f"original size, JPEG q{policy.get('jpeg_quality')}"
    return (
        f"{policy.get('min_pixels'):,}–{policy.get('max_pixels'):,} px, aspect ≤ {policy.get('max_aspect')}:1, "
        f"JPEG q{policy.get('jpeg_quality')}"
    )


def _judge_params(p: dict) -> str:
    parts = [
        f"{k.removeprefix('judge_')} {p[k]}"
        for k in ("judge_max_tokens", "judge_temperature", "judge_seed")
        if k in p
    ]
    return ", ".join(parts)


def _no_paths(message: str) -> str:
    """A message with absolute paths shortened to their last two parts (no machine path in the pages)."""
    return re.sub(r"(/[^\s:;,'\"()]+)+", lambda m: "…/" + "/".join(m.group(0).split("/")[-2:]), message)


# ---------------------------------------------------------------------------- one trajectory
def trajectory_page(
    run: Run, v: Verdict, index: int, truth, kind: str, word: str, agree, thumbs: ThumbnailCache
) -> str:
    threshold = v.config.get("threshold", run.protocol.get("threshold", 3))
    embedded = _embedded_screenshots(v)
    first_of: dict[str, int] = {}
    cards_html = []
    for s in v.screenshots:
        source = Path(s.path.split("#screenshot")[0]) if s.path else None
        data = embedded.get(s.index) if s.path and "#screenshot" in s.path else None
        images = thumbs.images(source, data) if (source or data) else None
        kept = s.index in v.kept
        badges = [f'<span class="badge">#{s.index}</span>']
        badges.append(f'<span class="badge">score {esc(s.score) if s.score is not None else "—"}</span>')
        if s.expected_score is not None:
            badges.append(f'<span class="badge">expected {s.expected_score:.2f}</span>')
        badges.append(
            '<span class="badge kept">kept</span>'
            if kept
            else f'<span class="muted">not kept (δ = {esc(threshold)})</span>'
        )
        duplicate = ""
        if images is not None:
            if images.digest in first_of:
                duplicate = (
                    f'<div class="desc">same image as #{first_of[images.digest]}: scored once (dedup)</div>'
                )
            else:
                first_of[images.digest] = s.index
            img = f'<a class="zoom" href="../{esc(images.view)}"><img loading="lazy" src="../{esc(images.thumb)}" alt="screenshot {s.index}"></a>'
        else:
            img = '<div class="err">screenshot not available</div>'
        error = f'<div class="err">{esc(_no_paths(s.error))}</div>' if s.error else ""
        cards_html.append(
            f'<div class="shot{" kept" if kept else ""}">{img}<div class="meta">{"".join(badges)}</div>'
            f'<div class="desc">{esc(s.thought)}</div>{duplicate}{error}</div>'
        )
    outcome = ""
    if v.outcome_calls and len(v.outcome_calls) > 1 or (v.outcome_calls and v.outcome_calls[0].key_point):
        items = "".join(
            f'<li class="{"met" if c.success else "unmet"}">{esc(c.key_point)} — '
            f"{'met' if c.success else ('not met' if c.success is False else 'no status')}</li>"
            for c in v.outcome_calls
        )
        outcome = f'<h2>Key points judged one by one (failure attribution)</h2><ul class="kps">{items}</ul>'
        outcome += "".join(f'<pre class="text">{esc(c.text)}</pre>' for c in v.outcome_calls if c.text)
    elif v.outcome_text:
        outcome = f'<h2>Outcome reasoning</h2><pre class="text">{esc(v.outcome_text)}</pre>'
    key_points = split_key_points(v.key_points or "")
    kp_html = (
        "<ol>" + "".join(f"<li>{esc(k)}</li>" for k in key_points) + "</ol>"
        if key_points
        else '<p class="muted">none</p>'
    )
    problems = "".join(f"<li>{esc(_no_paths(e))}</li>" for e in [*v.incomplete, *v.partial, *v.errors])
    usage = table(
        ["role", "calls", "cache hits", "errors", "prompt tokens", "completion tokens", "cost $"],
        [
            [r, u.calls, u.cached, u.errors, u.prompt_tokens, u.completion_tokens, f"{u.cost_usd:.4f}"]
            for r, u in v.usage.items()
        ],
        numeric={1, 2, 3, 4, 5, 6},
    )
    truth_badge = (
        f'<span class="badge {esc(truth)}">{esc(truth)}</span>'
        if truth
        else '<span class="muted">none</span>'
    )
    agree_text = "" if agree is None else (" · agrees" if agree else " · <b>disagrees</b>")
    body = f"""
<p><a href="../index.html">← all trajectories</a></p>
<div class="task">{esc(v.task)}</div>
<p>keyshot: <span class="badge {esc(word)}">{esc(word)}</span> · ground truth: {truth_badge}{agree_text} · kind: {esc(kind)}</p>
{key_values([("task id", v.task_id), ("agent", v.agent), ("benchmark", v.benchmark), ("source", Path(v.source).name if v.source else None)])}
<h2>Key points</h2>{kp_html}
<h2>Screenshots ({len(v.screenshots)}, {len(v.kept)} kept)</h2>
<div class="shots">{"".join(cards_html)}</div>
{outcome}
{f"<h2>Problems</h2><ul>{problems}</ul>" if problems else ""}
<h2>Calls</h2>{usage}
"""
    return page(
        f"{v.agent or ''} · {v.task_id}",
        body,
        root="..",
        subtitle=f"trajectory {index + 1} of {len(run.verdicts)}",
    )


def _embedded_screenshots(v: Verdict) -> dict[int, bytes]:
    """Screenshots stored inside a trajectory file (data URLs): read again from its source."""
    if not any(s.path and "#screenshot" in s.path for s in v.screenshots) or not v.source:
        return {}
    try:
        for t in load_trajectories(v.source, on_error="skip"):
            if t.task_id == v.task_id and (t.agent or None) == (v.agent or None):
                return {s.index: s.read_bytes() for s in t.screenshots if s.data is not None}
    except TrajectoryError as exc:
        logger.warning("report: %s", exc)
    return {}
