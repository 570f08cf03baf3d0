"""A run's summary: counts, usage and incomplete trajectories, from verdicts or from shards' summaries;
its Markdown, its exit code, and its files (``summary.json``, ``summary.md``: :func:`write_summary`,
:func:`read_summary`).

What could not be read has four named counts, never one overloaded "unreadable": a trajectory that could
not be loaded (``run.load_errors``, "not loaded"), a score answer without a score (``unreadable_scores``),
an answer cut by max_tokens (``cut_answers``) and a verdict without a status (``no_status``). A trajectory
none of whose screenshot scores could be read has no verdict (``no_readable_scores``; strict mode) and is
counted apart from failures; the success rate counts finished verdicts only (docs/architecture.md, "A verdict needs evidence").
An entry of the input that holds no trajectory (an archive, a stray file) is counted apart from a trajectory
that could not be loaded (``run.not_trajectories``), and a screenshot whose image could not be read (its
trajectory judged without it) is counted and named (``unreadable_images``).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from keyshot.infer.common.errors import EXIT_INCOMPLETE, EXIT_OK, raise_advice
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.loaders.trajectory import SkippedEntry, TrajectoryError
from keyshot.infer.protocol.verdicts import ROLES, RoleUsage, Verdict
from keyshot.infer.runs.counts import (
    FAILURE,
    INCOMPLETE,
    NO_SCORES,
    NO_STATUS,
    SUCCESS,
    CallSplit,
    call_split,
    judged_without_scores,
    outcome_of,
    success_rate,
)
from keyshot.infer.runs.run_record import RunFolderError, stand_in_of

SUMMARY_FILE = "summary.json"
SUMMARY_MARKDOWN = "summary.md"

_ADDITIVE = (
    "trajectories",
    "success",
    "failure",
    "failed_calls",
    "partial",
    "screenshots",
    "unreadable_scores",
    "failed_screenshots",
    "kept_screenshots",
    "cut_answers",
    "no_status",
    "no_readable_scores",
    "judged_without_scores",
    "unreadable_images",
)

#: How many screenshots whose image could not be read a summary names (the count says how many in all).
LISTED_IMAGES = 50


def summarize(verdicts: Iterable[Verdict], *, run: dict) -> dict:
    """Counts over every verdict in the file (previous runs included) plus this run's figures.

    One pass over ``verdicts``, which may be a generator.
    """
    counts = dict.fromkeys(_ADDITIVE, 0)
    calls = {role: CallSplit() for role in ROLES}
    incomplete: list[dict] = []
    images: list[str] = []  # the first screenshots whose image could not be read: file and reason
    usage = {role: RoleUsage() for role in ROLES}
    for v in verdicts:
        counts["trajectories"] += 1
        outcome = outcome_of(v)  # one outcome each: they add up to the trajectories
        counts["success"] += outcome == SUCCESS
        counts["failure"] += outcome == FAILURE
        counts["no_status"] += outcome == NO_STATUS
        counts["no_readable_scores"] += outcome == NO_SCORES and not v.finished
        counts["judged_without_scores"] += judged_without_scores(v)
        counts["failed_calls"] += outcome == INCOMPLETE
        counts["partial"] += bool(v.partial)
        counts["screenshots"] += len(v.screenshots)
        # unreadable: the scorer answered in full without a readable score; cut: by max_tokens; failed: no
        # answer (unreadable image, or the call failed after retries)
        counts["unreadable_scores"] += sum(1 for s in v.screenshots if s.error and s.raw and not s.cut)
        counts["failed_screenshots"] += sum(1 for s in v.screenshots if s.error and not s.raw and not s.cut)
        counts["kept_screenshots"] += len(v.kept)
        counts["cut_answers"] += len(v.cut)
        unreadable = [problem for shot in v.screenshots if (problem := shot.image_problem)]
        counts["unreadable_images"] += len(unreadable)
        images += unreadable[: LISTED_IMAGES - len(images)]
        for role, u in v.usage.items():
            usage.setdefault(role, RoleUsage()).merge(u)
            calls.setdefault(role, CallSplit()).add(call_split(v, role))
        if not v.finished:
            incomplete.append(
                {
                    "task_id": v.task_id,
                    "agent": v.agent,
                    "source": v.source,
                    "error": v.error,
                    "no_readable_scores": v.no_evidence is not None,
                }
            )
    return {**_summary(counts, usage, calls, incomplete, run), "unreadable_image_messages": images}


def combine_summaries(summaries: list[dict], *, run: dict) -> dict:
    """The summary of several verdict files (the shards of a run) from their own summaries: exactly what
    :func:`summarize` says of all their verdicts together."""
    counts = {key: sum(s.get(key, 0) for s in summaries) for key in _ADDITIVE}
    usage = {role: RoleUsage() for role in ROLES}
    for s in summaries:
        for role, u in s["usage"].items():
            usage.setdefault(role, RoleUsage()).merge(RoleUsage(**u))
    calls = {role: CallSplit() for role in ROLES}
    for s in summaries:
        for role, u in s["usage"].items():  # a shard summarized before "calls" existed: no copies known
            split = (s.get("calls") or {}).get(role) or {
                "answers": u["calls"],
                "sent": u["calls"] - u["cached"],
                "cache_hits": u["cached"],
                "same_image": 0,
            }
            calls.setdefault(role, CallSplit()).add(CallSplit(**split))
    incomplete = [t for s in summaries for t in s["incomplete_trajectories"]]
    images = [m for s in summaries for m in s.get("unreadable_image_messages", [])][:LISTED_IMAGES]
    return {**_summary(counts, usage, calls, incomplete, run), "unreadable_image_messages": images}


def input_figures(load_errors: list[TrajectoryError]) -> dict:
    """A run's figures of the input it did not judge: trajectories that could not be loaded, and
    entries that hold no trajectory (an archive, a stray file: the loaders' SkippedEntry), apart."""
    failed = [e for e in load_errors if not isinstance(e, SkippedEntry)]
    skipped = [e for e in load_errors if isinstance(e, SkippedEntry)]
    return {
        "load_errors": len(failed),
        "load_error_messages": [str(e) for e in failed],
        "not_trajectories": len(skipped),
        "not_trajectory_messages": [str(e) for e in skipped],
    }


def unreadable_images_line(summary: dict, shown: int = 3) -> str | None:
    """The terminal's line on screenshots whose image could not be read (their trajectories are judged
    without them), with the first few; None when there were none."""
    count = summary.get("unreadable_images", 0)
    if not count:
        return None
    first = [m.split(": ", 1)[0] for m in summary.get("unreadable_image_messages", [])[:shown]]
    more = f" and {count - len(first)} more" if count > len(first) else ""
    return (
        f"{count} screenshot(s) could not be read as images (their trajectories were judged without them; "
        f"summary.md says why): {', '.join(first)}{more}"
    )


def _summary(
    counts: dict, usage: dict[str, RoleUsage], calls: dict[str, CallSplit], incomplete: list[dict], run: dict
) -> dict:
    n = counts["trajectories"]
    outcomes = Counter(
        {SUCCESS: counts["success"], FAILURE: counts["failure"], NO_STATUS: counts["no_status"]}
    )
    return {
        **counts,
        "no_verdict": n - counts["success"] - counts["failure"],
        "errors": len(incomplete),
        "incomplete": len(incomplete),
        "incomplete_trajectories": incomplete,
        "success_rate": success_rate(outcomes),
        "usage": {role: dataclasses.asdict(u) for role, u in usage.items()},
        "calls": {role: dataclasses.asdict(split) for role, split in calls.items()},
        "judge_calls_per_trajectory": usage["judge"].calls / n if n else None,
        "run": run,
    }


def agreement_lines(agreement: dict | None) -> list[str]:
    """The summary's line of agreement with the truth the verdicts carry, naming it (``agreement`` is
    :func:`keyshot.infer.metrics.files.agreement_summary`'s); none without a truth."""
    if not agreement:
        return []

    def rate(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    return [
        f"Agreement with the truth ({agreement['truth']}): {rate(agreement['agreement'])} of "
        f"{agreement['n']} trajectories with one (judge success rate {rate(agreement['judge_sr'])}, the "
        f"truth's {rate(agreement['truth_sr'])}); keyshot metrics gives every table.",
        "",
    ]


def summary_markdown(summary: dict, ledger_table: str) -> str:
    sr = summary["success_rate"]
    run = summary["run"]
    no_scores = summary.get("no_readable_scores", 0) + summary.get("judged_without_scores", 0)
    judged_anyway = summary.get("judged_without_scores", 0)
    failed_calls = summary.get("failed_calls", summary["incomplete"] - summary.get("no_readable_scores", 0))
    lines = [
        "# keyshot judge summary"
        + (
            f" (merged from {summary['run']['merged_shards']} shards)"
            if summary["run"].get("merged_shards")
            else ""
        ),
        "",
        *([f"**{run['stand_in']}**", ""] if run.get("stand_in") else []),
        "| trajectories | success | failure | verdict without a status | no readable scores | failed calls "
        "| success rate | screenshots | kept |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {summary['trajectories']} | {summary['success']} | {summary['failure']} | "
        f"{summary.get('no_status', 0)} | {no_scores}{f' ({judged_anyway} judged anyway)' if judged_anyway else ''} | "
        f"{failed_calls} | {'n/a' if sr is None else f'{100 * sr:.1f}%'} | "
        f"{summary['screenshots']} | {summary['kept_screenshots']} |",
        "",
        *agreement_lines(summary.get("agreement")),
        "| not loaded (this run) | score answer without a score | cut by max_tokens | failed screenshots |",
        "|---:|---:|---:|---:|",
        f"| {run.get('load_errors', 0)} | {summary['unreadable_scores']} | {summary.get('cut_answers', 0)} | "
        f"{summary['failed_screenshots']} |",
        "",
        "Each trajectory has one outcome: success, failure, verdict without a status, no readable scores or "
        "failed calls. Success rate: successes over the verdicts that rest on readable scores and whose calls "
        "all answered (a verdict without a status counts as not success). No readable scores: none of the "
        "trajectory's screenshot scores could be read: no verdict (not a failure; the next run judges it "
        "again), or, with parse_mode=reference, a verdict judged anyway that rests on no screenshot and is "
        "counted in no success rate. Failed calls: a call failed after its retries (no verdict; re-run the "
        "same command to retry them, answered calls come from the cache). Score answer without a score: the "
        "scorer answered in full without a 1-5 score; cut by max_tokens: an answer (scorer or judge) stopped "
        "by its token limit, read as a failed call; failed screenshots: unreadable image or failed call.",
        "",
        "## Calls per role (all verdicts in the file)",
        "",
        "Answers: one per key-point and outcome call (judge) and one per screenshot (scorer); each was sent "
        "to the endpoint, came from the call cache (or an identical request in flight), or copies the answer "
        "of an identical screenshot of the same trajectory (scored once). The endpoint table below counts "
        "this run's HTTP requests (the answers sent, plus their retries).",
        "",
        "| role | answers | sent | from the cache | identical screenshots scored once | errors | prompt tokens "
        "| completion tokens | cost $ |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    calls = summary.get("calls") or {}
    for role, u in summary["usage"].items():
        split = calls.get(role) or {
            "sent": u["calls"] - u["cached"],
            "cache_hits": u["cached"],
            "same_image": 0,
        }
        lines.append(
            f"| {role} | {u['calls']:,} | {split['sent']:,} | {split['cache_hits']:,} | {split['same_image']:,} | "
            f"{u['errors']:,} | {u['prompt_tokens']:,} | {u['completion_tokens']:,} | {u['cost_usd']:.4f} |"
        )
    if run.get("merged_shards"):
        slowest = max((t or 0.0 for t in (run.get("shard_seconds") or {}).values()), default=0.0)
        heading = (
            f"## The last runs of its {run['merged_shards']} shards: {run['judged']} judged, {run['skipped']} "
            f"already done, {run['load_errors']} not loaded, {run.get('not_trajectories', 0)} not a trajectory; "
            f"the slowest shard took {slowest:.1f} s"
        )
    else:
        heading = (
            f"## This run: {run['judged']} judged, {run['skipped']} already done, {run['load_errors']} "
            f"not loaded, {run.get('not_trajectories', 0)} not a trajectory, {run['seconds']:.1f} s"
        )
    lines += [
        "",
        heading,
        "",
        ledger_table or "(no calls)",
        "",
    ]
    if run.get("stopped"):
        lines.append(f"**Stopped:** {run['stopped']}\n")
    lines += [f"**{line}**\n" for line in cut_lines(run.get("cut_answers") or [])]
    if summary.get("judged_without_scores"):
        lines.append(f"**{judged_without_scores_line(summary['judged_without_scores'])}**\n")
    if run.get("not_reached"):
        lines.append(
            f"{run['not_reached']} trajectories were not reached; re-run the same command to judge them.\n"
        )
    no_evidence = [t for t in summary["incomplete_trajectories"] if t.get("no_readable_scores")]
    failed = [t for t in summary["incomplete_trajectories"] if not t.get("no_readable_scores")]
    for title, listed in (
        ("No readable scores (no verdict; the next run judges them again)", no_evidence),
        ("Incomplete trajectories (re-run the same command to retry them)", failed),
    ):
        if listed:
            lines.append(f"## {title}\n")
            lines += [f"- {t['source'] or t['task_id']}: {t['error']}" for t in listed[:50]]
            lines.append("")
    if run.get("load_error_messages"):
        lines.append("## Trajectories that could not be read (not judged)\n")
        lines += [f"- {m}" for m in run["load_error_messages"]]
        lines.append("")
    if run.get("not_trajectory_messages"):
        lines.append("## Not a trajectory (not judged)\n")
        lines += [f"- {m}" for m in run["not_trajectory_messages"]]
        lines.append("")
    if summary.get("unreadable_image_messages"):
        shown = summary["unreadable_image_messages"]
        lines.append(
            f"## Screenshots that could not be read ({summary['unreadable_images']}; their trajectories were "
            "judged without them)\n"
        )
        lines += [f"- {m}" for m in shown]
        more = summary["unreadable_images"] - len(shown)
        lines += [f"- (and {more} more: verdicts.jsonl names each)", ""] if more > 0 else [""]
    if run.get("duplicates"):
        lines.append("## Duplicates (judged once)\n")
        lines += [f"- {m}" for m in run["duplicates"]]
        lines.append("")
    return "\n".join(lines)


def cut_lines(reports: list[dict]) -> list[str]:
    """One line per token-limit setting that cut answers in this run: what to change, and to what."""
    return [
        f"{r['cut']} of {r['answers']} answers under {r['setting']} were cut by max_tokens (at up to "
        f"{r['cut_tokens']} completion tokens; the longest answer seen: {r['longest_tokens']} tokens): "
        f"{raise_advice(r['setting'], r['cut_tokens'], r.get('trained_tokens'))}"
        for r in reports
    ]


def combine_cut_reports(reports: list[list[dict]]) -> list[dict]:
    """Several runs' (shards') cut answers per token-limit setting, as one run's."""
    by_setting: dict[str, dict] = {}
    for r in (r for run in reports for r in run):
        into = by_setting.setdefault(
            r["setting"], dict.fromkeys(("answers", "cut", "cut_tokens", "longest_tokens"), 0)
        )
        into["answers"] += r["answers"]
        into["cut"] += r["cut"]
        into["cut_tokens"] = max(into["cut_tokens"], r["cut_tokens"])
        into["longest_tokens"] = max(into["longest_tokens"], r["longest_tokens"])
    return [{"setting": setting, **counts} for setting, counts in by_setting.items()]


def judged_without_scores_line(count: int) -> str:
    return (
        f"{count} trajectories were judged although none of their screenshot scores could be read "
        "(parse_mode=reference keeps the reference's behaviour; their verdicts rest on no screenshot)"
    )


def exit_code(summary: dict) -> int:
    """The run's exit code (:mod:`keyshot.infer.common.errors`): a stop's own code, 3 when incomplete, else 0."""
    if summary["run"].get("exit_code"):
        return summary["run"]["exit_code"]
    return EXIT_INCOMPLETE if summary["incomplete"] else EXIT_OK


def write_summary(folder: Path, summary: dict, ledger_table: str) -> str:
    """Write ``summary.json`` and ``summary.md`` (with the usage table ``ledger_table``) into ``folder``,
    each atomically; returns the Markdown. A run of stand-in models (:func:`mark_stand_in`) says so in both."""
    if mark := stand_in_of(folder):
        summary["run"]["stand_in"] = mark
    write_text_atomic(folder / SUMMARY_FILE, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    markdown = summary_markdown(summary, ledger_table)
    write_text_atomic(folder / SUMMARY_MARKDOWN, markdown)
    return markdown


def read_summary(folder: Path) -> dict | None:
    """``folder/summary.json``, or None when there is none (the run has not finished)."""
    path = folder / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{path}: unreadable ({exc}); re-run that shard") from None
    return data if isinstance(data, dict) else None
