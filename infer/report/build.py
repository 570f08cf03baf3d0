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
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_bytes_atomic, write_text_atomic
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.metrics.compute import human_outcome
from keyshot.infer.metrics.files import truth_source
from keyshot.infer.metrics.operating_plots import reliability_diagram, sweep_plot
from keyshot.infer.protocol.parsing import split_key_points
from keyshot.infer.protocol.verdicts import Verdict, verdict_key
from keyshot.infer.report.model import (
    Run,
    calibration_of,
    first_met_here,
    ground_truth,
    kind_of,
    load_run,
    metrics_of,
    sweep_of,
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
from keyshot.infer.runs.counts import (
    INCOMPLETE,
    NO_SCORES,
    OUTCOME_LABELS,
    OUTCOMES,
    judged_without_scores,
    judged_word,
    outcome_of,
    outcome_text,
    success_rate,
    total_split,
)
from keyshot.infer.runs.run_record import constrained_text

logger = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
PAGES_DIR = "trajectories"
NO_NAME = "—"  # what the trajectory table shows for a verdict that names no agent


def build_report(
    source: Path | Run,
    out: Path,
    *,
    human_labels: dict[tuple[str, str], str] | None = None,
    progress: bool = True,
) -> Path:
    """Write the report of ``source`` (a run folder, verdict file or judge records, or a run already
    loaded with :func:`~keyshot.infer.report.model.load_run`) into ``out``."""
    run = source if isinstance(source, Run) else load_run(source)
    require_screenshots(run)
    out.mkdir(parents=True, exist_ok=True)
    (out / PAGES_DIR).mkdir(exist_ok=True)
    for name in ("report.css", "report.js"):
        write_bytes_atomic(out / "static" / name, (STATIC / name).read_bytes())
    truths = [ground_truth(v, human_labels) for v in run.verdicts]
    report = metrics_of(run, truths)
    thumbs = ThumbnailCache(out)
    sources = Sources()
    rows = []
    bar = tqdm(total=len(run.verdicts), desc="report", unit="traj", disable=not progress)
    for i, (v, (truth, _)) in enumerate(zip(run.verdicts, truths, strict=True)):
        href = f"{PAGES_DIR}/{i:05d}.html"
        kind = kind_of(v, truth)
        word = outcome_of(v)
        agree = None
        if human_outcome(truth) is not None and word not in (NO_SCORES, INCOMPLETE):
            agree = bool(v.success) == human_outcome(truth)
        # released records are no trajectory files: nothing to read again (their pages show what they hold)
        trajectory = sources.trajectory(v) if run.source_kind == "keyshot" else None
        page_html = trajectory_page(run, v, i, truth, kind, word, agree, thumbs, trajectory)
        write_text_atomic(out / href, page_html)
        rows.append(
            {
                "index": i,
                "href": href,
                "agent": v.agent or NO_NAME,
                "benchmark": v.benchmark or "",
                "task_id": v.task_id,
                "run": v.run or "",
                "task": v.task if len(v.task) <= 160 else v.task[:159] + "…",
                "verdict": word,
                "judged": judged_word(v),
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
    scores = [s.score if s.valid else None for v in run.verdicts for s in v.screenshots]
    threshold = float(run.protocol.get("threshold", 3) or 3)
    calibration = calibration_of(run, truths)
    sweep = sweep_of(run.path, human_labels) if run.path is not None else None
    operating = []  # the operating point's pictures, beside the score histogram, where there is data
    if calibration is not None:
        operating.append(("reliability.png", reliability_diagram(calibration, run.stand_in)))
    if sweep is not None:
        operating.append(("deltas.png", sweep_plot(sweep, run.stand_in)))
    for name, data in (
        ("scores.png", plots.score_histogram(scores, threshold)),
        *operating,
        ("agents.png", plots.agent_success_rates(report)),
        ("confusion.png", plots.confusion_matrix([(r["verdict"], r["truth"]) for r in rows if r["truth"]])),
        # (the matrix's rows are the outcomes of runs.counts: a verdict judged without readable scores is
        # counted under "no-scores", as in every other count)
    ):
        write_bytes_atomic(out / "plots" / name, data)
    write_text_atomic(out / "index.html", index_page(run, rows, report, [name for name, _ in operating]))
    logger.info(
        "report: %d trajectories, %d screenshots converted, %d reused",
        len(rows),
        thumbs.converted,
        thumbs.reused,
    )
    return out / "index.html"


def require_screenshots(run: Run) -> None:
    """Refuse, in one line, a run whose verdicts name screenshot files none of which can be found: a
    report of them would show none (a folder moved, or verdicts of an older keyshot judged elsewhere)."""
    files = [Path(s.path.split("#screenshot")[0]) for v in run.verdicts for s in v.screenshots if s.path]
    if files and not any(f.exists() for f in files):
        raise KeyshotError(
            f"{run.path or 'the run'}: none of its {len(files)} screenshots can be found (the first: "
            f"{files[0]}): put the trajectories back where the verdicts say they were, or judge them again"
        )


# ---------------------------------------------------------------------------- index
_OPERATING_ALT = {
    "reliability.png": "reliability diagram of p_success",
    "deltas.png": "the sweep's δ side by side",
}


def index_page(run: Run, rows: list[dict], report, operating: list[str] = ()) -> str:
    words = Counter(r["verdict"] for r in rows)
    kinds = Counter(r["kind"] for r in rows)
    cost = sum(r["cost"] for r in rows)
    judged_anyway = sum(judged_without_scores(v) for v in run.verdicts)
    scorer = total_split(run.verdicts, "scorer")
    counts = cards(
        [
            ("trajectories", len(rows)),
            *[(OUTCOME_LABELS[o], words[o]) for o in OUTCOMES],
            *(
                [("judged anyway without a readable score (reference mode)", judged_anyway)]
                if judged_anyway
                else []
            ),
            ("screenshots", sum(r["shots"] for r in rows)),
            ("kept", sum(r["kept"] for r in rows)),
            (
                "scorer answers sent / from the cache / identical screenshot",
                f"{scorer.sent} / {scorer.cache_hits} / {scorer.same_image}",
            ),
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
            ("answer format", constrained_text(p) or "free (not constrained)"),
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
                    [attr, "trajectories", *(OUTCOME_LABELS[o] for o in OUTCOMES), "keyshot SR %"],
                    [
                        [g, n, *(group[o] for o in OUTCOMES), _rate(group)]
                        for g, n in sorted(groups.items())
                        for group in [Counter(r["verdict"] for r in rows if r[attr] == g)]
                    ],
                    numeric=set(range(1, len(OUTCOMES) + 3)),
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
                "a call failed, or no screenshot score could be read: no verdict that counts; re-run "
                "keyshot judge to retry failed calls",
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
    beside = "".join(f'<img src="plots/{name}" alt="{_OPERATING_ALT[name]}">' for name in operating)
    truth_named = f": {esc(truth_source(report))}" if report is not None else ""
    body = f"""
{stand_in_banner(run)}
<h2>Run</h2>{counts}
<div class="grid2">
<div><h2>Protocol that produced these verdicts</h2>{protocol}</div>
<div><h2>Kinds of outcome</h2>{apart}</div>
</div>
<h2>Agreement with the truth{truth_named}</h2>{metrics_tables(report)}
<h2>Plots</h2>
<div class="plots"><img src="plots/scores.png" alt="score histogram">{beside}<img src="plots/agents.png" alt="success rate per agent">
<img src="plots/confusion.png" alt="confusion matrix"></div>
<div class="grid2">{"".join(by_group)}</div>
{unread_html}
<h2>Trajectories</h2>
{TRAJECTORY_TABLE}
{json_script("rows", rows)}
"""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return page(f"keyshot report: {run.name}", body, subtitle=f"{len(rows)} trajectories · built {stamp}")


def _rate(outcomes: Counter) -> str:
    """The success rate of runs.counts, in percent, for a table cell."""
    rate = success_rate(outcomes)
    return "—" if rate is None else f"{100 * rate:.1f}"


def stand_in_banner(run: Run) -> str:
    """The warning a page opens with when its verdicts rest on nothing: a run of stand-in models, or
    verdicts judged without a readable screenshot score."""
    lines = [run.stand_in] if run.stand_in else []
    judged = sum(judged_without_scores(v) for v in run.verdicts)
    if judged:
        lines.append(
            (
                "This verdict was judged although none of its screenshot scores could be read "
                "(parse_mode=reference): it rests on no screenshot and is counted"
                if len(run.verdicts) == 1
                else f"{judged} of {len(run.verdicts)} verdicts were judged although none of their screenshot "
                "scores could be read (parse_mode=reference): they rest on no screenshot and are counted"
            )
            + " under “no readable scores”, in no success rate."
        )
    return "".join(f'<div class="banner">{esc(line)}</div>' for line in lines)


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
    run: Run,
    v: Verdict,
    index: int,
    truth,
    kind: str,
    word: str,
    agree,
    thumbs: ThumbnailCache,
    trajectory: Trajectory | None = None,
) -> str:
    threshold = v.config.get("threshold", run.protocol.get("threshold", 3))
    embedded = _embedded_screenshots(trajectory)
    steps = _steps(trajectory)
    met_here = first_met_here(v)
    progress = dict(zip((s.index for s in v.screenshots), v.step_progress or [], strict=False))
    first_of: dict[str, int] = {}
    cards_html = []
    for s in v.screenshots:
        source = Path(s.path.split("#screenshot")[0]) if s.path else None
        data = embedded.get(s.index) if s.path and "#screenshot" in s.path else None
        images = thumbs.images(source, data) if (source or data) else None
        kept = s.index in v.kept
        badges = [f'<span class="badge">#{s.index}</span>']
        badges.append(f'<span class="badge">{f"score {esc(s.score)}" if s.valid else "no score"}</span>')
        if s.expected_score is not None:
            badges.append(f'<span class="badge">expected {s.expected_score:.2f}</span>')
        if s.index in progress:
            badges.append(f'<span class="badge">progress {100 * progress[s.index]:.0f}%</span>')
        badges.append(
            '<span class="badge kept">kept</span>'
            if kept
            else f'<span class="muted">not kept (δ = {esc(threshold)})</span>'
        )
        duplicate = ""
        same = s.same_as
        if images is not None:
            same = same if same is not None else first_of.get(images.digest)
            first_of.setdefault(images.digest, s.index)
            img = f'<a class="zoom" href="../{esc(images.view)}"><img loading="lazy" src="../{esc(images.thumb)}" alt="screenshot {s.index}"></a>'
        else:
            img = '<div class="err">screenshot not available</div>'
        if same is not None:
            duplicate = f'<div class="desc">same image as #{same}: scored once</div>'
        error = f'<div class="err">{esc(_no_paths(s.error))}</div>' if s.error else ""
        met = met_here.get(s.index)
        met_html = f'<div class="desc met"><b>first met here:</b> {esc("; ".join(met))}</div>' if met else ""
        cards_html.append(
            f'<div class="shot{" kept" if kept else ""}">{img}<div class="meta">{"".join(badges)}</div>'
            f"{_step_html(steps.get(s.index))}"
            f'<div class="desc"><b>scorer:</b> {esc(s.thought)}</div>{met_html}{duplicate}{error}</div>'
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
        [
            "role",
            "answers",
            "from the cache or an identical screenshot",
            "errors",
            "prompt tokens",
            "completion tokens",
            "cost $",
        ],
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
    actions_note = (
        ""
        if steps
        else '<p class="muted">The agent\'s actions are not shown: its trajectory could not be read again '
        "from its source.</p>"
    )
    body = f"""
{stand_in_banner(Run(run.name, [v], stand_in=run.stand_in))}
<p><a href="../index.html">← all trajectories</a></p>
<div class="task">{esc(v.task)}</div>
<p>keyshot: <span class="badge {esc(word)}">{esc(outcome_text(v))}</span> · ground truth: {truth_badge}{agree_text} · kind: {esc(kind)}</p>
{key_values([("task id", v.task_id), ("agent", v.agent), ("benchmark", v.benchmark), ("run", v.run), ("source", Path(v.source).name if v.source else None)])}
<h2>Key points</h2>{kp_html}
<h2>Screenshots ({len(v.screenshots)}, {len(v.kept)} kept), each with the agent's action on that page</h2>
{actions_note}
<div class="shots">{"".join(cards_html)}</div>
{_final_answer_html(trajectory)}
{outcome}
{f"<h2>Problems</h2><ul>{problems}</ul>" if problems else ""}
<h2>Calls</h2>{usage}
"""
    run_part = f" · run {v.run}" if v.run else ""
    return page(
        f"{v.agent or ''} · {v.task_id}{run_part}",
        body,
        root="..",
        subtitle=f"trajectory {index + 1} of {len(run.verdicts)} · {esc(run.name)}",
    )


class Sources:
    """The judged trajectories read again from their sources (for the agent's actions and thoughts and
    for embedded screenshots); the last source read is kept, as a run's verdicts come source by source."""

    def __init__(self) -> None:
        self._source: str | None = None
        self._held: dict[tuple[str, str, str], Trajectory] = {}

    def trajectory(self, v: Verdict) -> Trajectory | None:
        """``v``'s trajectory, or None when its source is gone or no longer holds it."""
        if not v.source:
            return None
        if v.source != self._source:
            self._source, self._held = v.source, {}
            try:
                self._held = {
                    verdict_key(t.task_id, t.agent, t.run): t
                    for t in load_trajectories(v.source, on_error="skip")
                }
            except TrajectoryError as exc:
                logger.warning("report: %s", exc)
        return self._held.get(v.key) or self._held.get(verdict_key(v.task_id, v.agent, None))


def _steps(t: Trajectory | None) -> dict[int, tuple[str, str]]:
    """The agent's (action, thought) on each screenshot's page, by screenshot index: the i-th screenshot
    is the page the i-th action was taken on."""
    if t is None:
        return {}
    thoughts = t.thoughts or []
    return {
        shot.index: (t.actions[i], thoughts[i] if i < len(thoughts) else "")
        for i, shot in enumerate(t.screenshots)
        if i < len(t.actions)
    }


def _step_html(step: tuple[str, str] | None) -> str:
    if step is None:
        return ""
    action, thought = step
    html = f'<div class="desc action"><b>action:</b> <code>{esc(action)}</code></div>'
    return html + (f'<div class="desc"><b>agent thought:</b> {esc(thought)}</div>' if thought else "")


def _final_answer_html(t: Trajectory | None) -> str:
    answer = t.final_answer if t is not None else None
    return f'<h2>The agent\'s final answer</h2><pre class="text">{esc(answer)}</pre>' if answer else ""


def _embedded_screenshots(t: Trajectory | None) -> dict[int, bytes]:
    """Screenshots stored inside a trajectory file (data URLs), read again from its source."""
    if t is None:
        return {}
    return {s.index: s.read_bytes() for s in t.screenshots if s.data is not None}
