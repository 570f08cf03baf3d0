"""A run's summary: counts, usage and incomplete trajectories, from verdicts or from shards' summaries;
its Markdown and its exit code."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from keyshot.infer.common.errors import EXIT_INCOMPLETE, EXIT_OK
from keyshot.infer.protocol.verdicts import ROLES, RoleUsage, Verdict

_ADDITIVE = (
    "trajectories",
    "success",
    "failure",
    "partial",
    "screenshots",
    "unreadable_scores",
    "failed_screenshots",
    "kept_screenshots",
)


def summarize(verdicts: Iterable[Verdict], *, run: dict) -> dict:
    """Counts over every verdict in the file (previous runs included) plus this run's figures.

    One pass over ``verdicts``, which may be a generator.
    """
    counts = dict.fromkeys(_ADDITIVE, 0)
    incomplete: list[dict] = []
    usage = {role: RoleUsage() for role in ROLES}
    for v in verdicts:
        counts["trajectories"] += 1
        counts["success"] += v.success is True
        counts["failure"] += v.success is False
        counts["partial"] += bool(v.partial)
        counts["screenshots"] += len(v.screenshots)
        # unreadable: the scorer answered without a readable score; failed: no answer (unreadable
        # image, or the call failed after retries)
        counts["unreadable_scores"] += sum(1 for s in v.screenshots if s.error and s.raw)
        counts["failed_screenshots"] += sum(1 for s in v.screenshots if s.error and not s.raw)
        counts["kept_screenshots"] += len(v.kept)
        for role, u in v.usage.items():
            usage.setdefault(role, RoleUsage()).merge(u)
        if not v.finished:
            incomplete.append({"task_id": v.task_id, "agent": v.agent, "source": v.source, "error": v.error})
    return _summary(counts, usage, incomplete, run)


def combine_summaries(summaries: list[dict], *, run: dict) -> dict:
    """The summary of several verdict files (the shards of a run) from their own summaries: exactly what
    :func:`summarize` says of all their verdicts together."""
    counts = {key: sum(s[key] for s in summaries) for key in _ADDITIVE}
    usage = {role: RoleUsage() for role in ROLES}
    for s in summaries:
        for role, u in s["usage"].items():
            usage.setdefault(role, RoleUsage()).merge(RoleUsage(**u))
    incomplete = [t for s in summaries for t in s["incomplete_trajectories"]]
    return _summary(counts, usage, incomplete, run)


def _summary(counts: dict, usage: dict[str, RoleUsage], incomplete: list[dict], run: dict) -> dict:
    n = counts["trajectories"]
    return {
        **counts,
        "no_verdict": n - counts["success"] - counts["failure"],
        "errors": len(incomplete),
        "incomplete": len(incomplete),
        "incomplete_trajectories": incomplete,
        "success_rate": counts["success"] / n if n else None,
        "usage": {role: dataclasses.asdict(u) for role, u in usage.items()},
        "judge_calls_per_trajectory": usage["judge"].calls / n if n else None,
        "run": run,
    }


def summary_markdown(summary: dict, ledger_table: str) -> str:
    sr = summary["success_rate"]
    lines = [
        "# keyshot judge summary"
        + (
            f" (merged from {summary['run']['merged_shards']} shards)"
            if summary["run"].get("merged_shards")
            else ""
        ),
        "",
        "| trajectories | success | failure | no verdict | incomplete | success rate | screenshots | kept "
        "| unreadable scores | failed screenshots |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {summary['trajectories']} | {summary['success']} | {summary['failure']} | {summary['no_verdict']} | "
        f"{summary['incomplete']} | {'n/a' if sr is None else f'{100 * sr:.1f}%'} | {summary['screenshots']} | "
        f"{summary['kept_screenshots']} | {summary['unreadable_scores']} | {summary['failed_screenshots']} |",
        "",
        "Success rate: successes over all trajectories in the verdict file (no verdict counts as not success). "
        "Incomplete: trajectories a call of which failed (no verdict; re-run the same command to retry them, "
        "answered calls come from the cache). Unreadable scores: the scorer answered without a 1-5 score; "
        "failed screenshots: unreadable image or failed call.",
        "",
        "## Calls per role (all verdicts in the file)",
        "",
        "| role | calls | cache hits | errors | prompt tokens | completion tokens | cost $ |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for role, u in summary["usage"].items():
        lines.append(
            f"| {role} | {u['calls']:,} | {u['cached']:,} | {u['errors']:,} | {u['prompt_tokens']:,} | "
            f"{u['completion_tokens']:,} | {u['cost_usd']:.4f} |"
        )
    run = summary["run"]
    if run.get("merged_shards"):
        slowest = max((t or 0.0 for t in (run.get("shard_seconds") or {}).values()), default=0.0)
        heading = (
            f"## The last runs of its {run['merged_shards']} shards: {run['judged']} judged, {run['skipped']} "
            f"already done, {run['load_errors']} unreadable; the slowest shard took {slowest:.1f} s"
        )
    else:
        heading = (
            f"## This run: {run['judged']} judged, {run['skipped']} already done, {run['load_errors']} "
            f"unreadable, {run['seconds']:.1f} s"
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
    if run.get("not_reached"):
        lines.append(
            f"{run['not_reached']} trajectories were not reached; re-run the same command to judge them.\n"
        )
    if summary["incomplete"]:
        lines.append("## Incomplete trajectories (re-run the same command to retry them)\n")
        lines += [
            f"- {t['source'] or t['task_id']}: {t['error']}" for t in summary["incomplete_trajectories"][:50]
        ]
        lines.append("")
    if run.get("load_error_messages"):
        lines.append("## Trajectories that could not be read (not judged)\n")
        lines += [f"- {m}" for m in run["load_error_messages"]]
        lines.append("")
    if run.get("duplicates"):
        lines.append("## Duplicates (judged once)\n")
        lines += [f"- {m}" for m in run["duplicates"]]
        lines.append("")
    return "\n".join(lines)


def exit_code(summary: dict) -> int:
    """The run's exit code (:mod:`keyshot.infer.common.errors`): a stop's own code, 3 when incomplete, else 0."""
    if summary["run"].get("exit_code"):
        return summary["run"]["exit_code"]
    return EXIT_INCOMPLETE if summary["incomplete"] else EXIT_OK
