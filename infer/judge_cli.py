"""``keyshot judge``: WebJudge over trajectory folders, resumable, with a cost summary.

    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml out=runs/seeact
    keyshot judge runs/agentlab --config configs/judge/reference_gpt4o.yaml judge.budget_usd=20
    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml --serve-scorer ckpt/
    keyshot judge data/om2w/SeeAct --config configs/judge/reference_gpt4o.yaml \\
        --resume-from SeeAct/WebJudge_Online_Mind2Web_eval_gpt-4o_score_threshold_3_auto_eval_results.json

Writes ``OUT/verdicts.jsonl`` (one line per trajectory, appended atomically), ``OUT/summary.md`` and
``OUT/summary.json``, and keeps every judge/scorer answer in ``OUT/calls.sqlite``. Re-running the same
command after any stop (Ctrl-C, ``kill -9``, a budget stop) judges only what is missing and pays for
no call twice. API keys are read from the environment variables the config names, never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import logging
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from infer.cache import CacheError, CallCache
from infer.checkpoint import CheckpointError
from infer.client import EndpointConfig, JudgeClient
from infer.config import ConfigError, config_to_dict, load_config
from infer.errors import EXIT_INCOMPLETE, EXIT_OK, KeyshotError, RunStopError, require_training_stack
from infer.fileio import write_text_atomic
from infer.helptext import plain
from infer.images import DEFAULT_POLICY, REFERENCE_POLICY, ImagePolicy
from infer.pipeline import PipelineConfig, WebJudge
from infer.pool import DEFAULT_COOLDOWN_S, EndpointPool, member_configs
from infer.preflight import preflight
from infer.prompts import load_prompt_set
from infer.redaction import redact_config
from infer.runlock import RunLock
from infer.scorer import KeyScreenshotScorer, OpenAIScorer, TransformersScorer, checkpoint_image_policy
from infer.serve import ServeConfig, ServeError, VLLMServer
from infer.shards import SUMMARY_FILE, ShardError, ShardSpec
from infer.trajectory import Trajectory, TrajectoryError, load_trajectories
from infer.usage import BudgetExceededError, UsageLedger
from infer.verdicts import (
    ROLES,
    VERDICTS_FILE,
    ResumeIndex,
    RoleUsage,
    Verdict,
    VerdictFileError,
    VerdictWriter,
    latest_verdicts,
    read_reference_records,
    read_verdicts,
    verdict_key,
)

logger = logging.getLogger(__name__)

CACHE_FILE = "calls.sqlite"
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")


@dataclass
class ScorerConfig:
    """The key-screenshot scorer.

    ``backend``: ``openai`` (an OpenAI-compatible endpoint, e.g. ``keyshot serve``, or ``endpoints``:
    several replicas of it, each call to the least-loaded live one), ``transformers``
    (in-process, ``checkpoint`` is the model folder) or ``none`` (reference configuration: the judge
    scores every screenshot). ``checkpoint`` also fixes the image policy (its training pixel bounds);
    without it, ``min_pixels``/``max_pixels`` do, else keyshot's default policy.
    """

    backend: Literal["openai", "transformers", "none"] = "openai"
    endpoint: EndpointConfig | None = None
    endpoints: list[EndpointConfig] | None = None  # a pool of replicas of one model (infer.pool)
    cooldown_s: float = DEFAULT_COOLDOWN_S  # how long a failed pool endpoint is left out
    checkpoint: str | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    logprobs: int | None = None
    max_tokens: int | None = None
    retry_invalid: bool = False
    device: str = "cpu"
    dtype: str = "auto"  # bfloat16 on CUDA, float32 on CPU
    batch_size: int = 4
    serve: ServeConfig | None = None  # settings for --serve-scorer

    def __post_init__(self) -> None:
        if self.endpoint is not None and self.endpoints:
            raise ValueError("set scorer.endpoint (one) or scorer.endpoints (a pool), not both")
        if self.endpoints:
            member_configs(self.endpoints)  # one model, no endpoint twice
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be within [0, 20] (or null), got {self.logprobs}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (or null), got {self.max_tokens}")


@dataclass
class JudgeRunConfig:
    """One ``keyshot judge`` run (``configs/judge/*.yaml``)."""

    judge: EndpointConfig
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    out: str = "runs/judge"
    cache: str | None = None  # default OUT/calls.sqlite
    format: str = "auto"
    agent: str | None = None  # for formats that do not name the agent
    benchmark: str | None = None
    concurrency: int = 4  # trajectories judged at once
    limit: int | None = None
    shard_by: Literal["task", "trajectory"] = "task"  # what --shard I/N hashes (infer.shards)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or null for all), got {self.limit}")


class JudgeRunError(KeyshotError):
    """A run that cannot start (bad config, no trajectories, unreadable files, another protocol)."""


RUN_FILE = "run.json"


# ---------------------------------------------------------------------------- building blocks
def _policy(cfg: ScorerConfig) -> ImagePolicy | None:
    if cfg.checkpoint:
        return checkpoint_image_policy(cfg.checkpoint)
    if cfg.min_pixels is not None and cfg.max_pixels is not None:
        return ImagePolicy(min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels)
    if cfg.backend == "openai":
        logger.warning(
            "scorer.checkpoint is not set: images use keyshot's default policy (%d..%d px); set it so "
            "the scorer sees images as it was trained",
            DEFAULT_POLICY.min_pixels,
            DEFAULT_POLICY.max_pixels,
        )
    return None


def build_scorer(
    cfg: JudgeRunConfig, cache: CallCache | None, ledger: UsageLedger, endpoint: EndpointConfig | None = None
) -> KeyScreenshotScorer | None:
    """The configured scorer (None for the reference configuration)."""
    sc = cfg.scorer
    prompts = load_prompt_set(cfg.pipeline.prompt_variant)
    if sc.backend == "none":
        return None
    if sc.backend == "transformers":
        if not sc.checkpoint:
            raise JudgeRunError("scorer.backend=transformers needs scorer.checkpoint (a model folder)")
        return TransformersScorer(
            sc.checkpoint,
            prompts,
            device=sc.device,
            dtype=sc.dtype,
            batch_size=sc.batch_size,
            max_new_tokens=sc.max_tokens or 512,
            parse_mode=cfg.pipeline.parse_mode,
            logprobs=sc.logprobs,
        )
    endpoint = endpoint or sc.endpoint
    if endpoint is None and not sc.endpoints:
        raise JudgeRunError("scorer.backend=openai needs scorer.endpoint (or --serve-scorer CHECKPOINT)")
    client = (
        JudgeClient(endpoint, cache, ledger)
        if endpoint is not None
        else EndpointPool(sc.endpoints, cache, ledger, cooldown_s=sc.cooldown_s)
    )
    return OpenAIScorer(
        client,
        prompts,
        parse_mode=cfg.pipeline.parse_mode,
        logprobs=sc.logprobs,
        max_tokens=sc.max_tokens,
        policy=_policy(sc),
        retry_invalid=sc.retry_invalid,
    )


def load_all(
    paths: list[str],
    cfg: JudgeRunConfig,
    allow_outside: tuple[str, ...] = (),
    shard: ShardSpec | None = None,
) -> tuple[list[Trajectory], list[TrajectoryError], list[str], int]:
    """The input's trajectories (one per identity; with ``shard``, only that shard's), the ones that
    could not be read (with ``shard``, reported by shard 0 alone), the duplicates, and how many
    trajectories the whole input holds."""
    trajectories: list[Trajectory] = []
    errors: list[TrajectoryError] = []
    for p in paths:
        trajectories.extend(
            load_trajectories(
                p,
                cfg.format,
                on_error="skip",
                agent=cfg.agent,
                benchmark=cfg.benchmark,
                errors=errors,
                allow_outside=allow_outside,
            )
        )
    found = len(trajectories)
    if shard is not None:
        trajectories = [t for t in trajectories if shard.holds(t, cfg.shard_by)]
        errors = errors if shard.index == 0 else []
    seen: dict[tuple[str, str, str], Trajectory] = {}
    unique = []
    duplicates: list[str] = []
    for t in trajectories:
        key = verdict_key(t.task_id, t.agent, t.run)
        if key in seen:
            first = seen[key].source
            same = (
                "the same trajectory reached twice" if first == t.source else f"the same identity as {first}"
            )
            duplicates.append(
                f"{t.source}: task {t.task_id} (agent {t.agent}, run {t.run}) is {same}; judged once"
            )
            logger.warning("%s", duplicates[-1])
            continue
        seen[key] = t
        unique.append(t)
    if cfg.limit is not None:
        unique = unique[: cfg.limit]
    return unique, errors, duplicates, found


def import_reference(
    path: str, out_file: Path, threshold: float, trajectories: list[Trajectory] | None = None
) -> tuple[int, int]:
    """Append the reference outputs' verdicts that ``out_file`` does not have yet, only for tasks of
    ``trajectories`` (when given); returns (imported, left out because not in the input)."""
    records = read_reference_records(path, threshold=int(threshold))
    left_out = 0
    if trajectories is not None:
        keys = {(t.task_id, t.agent or "") for t in trajectories}
        tasks = {t.task_id for t in trajectories}
        kept = [r for r in records if ((r.task_id, r.agent or "") in keys if r.agent else r.task_id in tasks)]
        left_out = len(records) - len(kept)
        records = kept
    have = ResumeIndex(read_verdicts(out_file))
    new = [r for r in records if not have.done(r.task_id, r.agent)]
    with VerdictWriter(out_file) as writer:
        for v in new:
            writer.append(v)
    logger.info("imported %d of %d reference records from %s", len(new), len(records), path)
    if left_out:
        logger.warning("%s: %d records are of tasks not in the input; left out", path, left_out)
    return len(new), left_out


# ---------------------------------------------------------------------------- the run
async def judge_all(
    webjudge: WebJudge,
    trajectories: list[Trajectory],
    writer: VerdictWriter,
    concurrency: int,
    *,
    progress: bool = True,
) -> list[Verdict]:
    """Judge ``trajectories`` (at most ``concurrency`` at once), appending each verdict as it is done.

    Stops starting new trajectories once an endpoint's budget is spent or an endpoint is down (they
    are judged on resume).
    """
    slots = asyncio.Semaphore(max(1, concurrency))
    done: list[Verdict] = []
    bar = tqdm(total=len(trajectories), desc="judging", unit="traj", disable=not progress)
    stop = asyncio.Event()

    async def one(t: Trajectory) -> None:
        async with slots:
            if stop.is_set():
                return
            try:
                verdict = await webjudge.judge(t)
            except RunStopError as exc:
                if not stop.is_set():
                    logger.error("%s; stopping: re-run the same command to finish", exc)
                stop.set()
                return  # not judged: left for a resumed run
            writer.append(verdict)
            done.append(verdict)
            bar.update(1)
            bar.set_postfix(incomplete=sum(not v.finished for v in done))

    try:
        await asyncio.gather(*(one(t) for t in trajectories))
    finally:
        bar.close()
        await webjudge.aclose()
    return done


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


def nothing_found_message(paths: list[str], load_errors: list[TrajectoryError]) -> str:
    """What was looked for and what was seen instead, when no trajectory could be read."""
    looked = (
        "looked for Online-Mind2Web task folders (result.json + trajectory/), per-agent folders of them, "
        "AgentLab runs (summary_info.json, screenshot_step_N.png) and .jsonl files"
    )
    if not load_errors:
        return f"no trajectories in {', '.join(paths)}: {looked}"
    shown = "; ".join(str(e) for e in load_errors[:3])
    more = f" (and {len(load_errors) - 3} more)" if len(load_errors) > 3 else ""
    return (
        f"no readable trajectory in {', '.join(paths)} ({looked}): {len(load_errors)} failed: {shown}{more}"
    )


def protocol_fingerprint(cfg: JudgeRunConfig) -> dict:
    """What decides a run's verdicts: a run folder keeps its verdicts only for this protocol."""
    sc, pipe = cfg.scorer, cfg.pipeline
    if sc.backend == "none":
        policy, scorer_model = REFERENCE_POLICY, None
    else:
        policy = _policy(sc) or DEFAULT_POLICY
        served = sc.endpoint or (sc.endpoints[0] if sc.endpoints else None)
        scorer_model = sc.checkpoint or (served.model if served else None)
    return {
        "prompt_version": load_prompt_set(pipe.prompt_variant).version,
        "prompt_variant": pipe.prompt_variant,
        "outcome_mode": pipe.outcome_mode,
        "parse_mode": pipe.parse_mode,
        "threshold": pipe.threshold,
        "threshold_on": pipe.threshold_on,
        "max_kept": pipe.max_kept,
        "outcome_images": pipe.outcome_images,
        "allow_partial": pipe.allow_partial,
        "judge_model": cfg.judge.model,
        "judge_max_tokens": cfg.judge.max_tokens,
        "judge_temperature": cfg.judge.temperature,
        "judge_seed": cfg.judge.seed,
        "scorer_backend": sc.backend,
        "scorer_model": scorer_model,
        "scorer_checkpoint_hash": checkpoint_hash(sc.checkpoint) if sc.checkpoint else None,
        "image_policy": policy.to_dict(),
    }


def checkpoint_hash(folder: str) -> str | None:
    """A short hash of a checkpoint's identity: its config, keyshot metadata and weight files' sizes."""
    root = Path(folder)
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for name in ("config.json", "keyshot.json", "adapter_config.json"):
        if (root / name).is_file():
            digest.update(name.encode() + (root / name).read_bytes())
    for weights in sorted(root.glob("*.safetensors")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def read_protocol(folder: Path) -> dict | None:
    """The protocol recorded in ``folder/run.json``, or None when the folder has none yet."""
    path = folder / RUN_FILE
    if not path.exists():
        return None
    try:
        protocol = json.loads(path.read_text(encoding="utf-8")).get("protocol", {})
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise JudgeRunError(
            f"{path}: not a keyshot run file ({exc}); move it away or use another --out"
        ) from None
    if "variant" in protocol and "prompt_variant" not in protocol:  # folders written before the rename
        protocol["prompt_variant"] = protocol.pop("variant")
    return protocol


def protocol_differences(a: dict, b: dict, names: tuple[str, str] = ("in the folder", "now")) -> str:
    """What differs between two protocols, ``key: <a's> in the folder, <b's> now; …`` ("" if nothing)."""
    differ = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "; ".join(f"{k}: {a.get(k)!r} {names[0]}, {b.get(k)!r} {names[1]}" for k in differ)


def check_fingerprint(out: Path, fingerprint: dict, *, record: bool = True) -> None:
    """Refuse a run folder made with another protocol; record the protocol in ``OUT/run.json``
    (unless ``record`` is False: a dry run writes nothing)."""
    recorded = read_protocol(out)
    if recorded is not None:
        shown = protocol_differences(recorded, fingerprint)
        if shown:
            raise JudgeRunError(
                f"{out} holds verdicts of another protocol ({shown}); its verdicts cannot be reused: "
                "use a new --out (or the settings the folder was made with)"
            )
        return
    if record:
        write_text_atomic(out / RUN_FILE, json.dumps({"protocol": fingerprint}, indent=2) + "\n")


def run_folder(cfg: JudgeRunConfig, shard: ShardSpec | None) -> Path:
    """Where a run writes: ``OUT``, or ``OUT/shard-I-of-N`` for one shard."""
    return Path(cfg.out) / shard.folder if shard else Path(cfg.out)


def check_endpoints(cfg: JudgeRunConfig, serve_scorer: str | None) -> None:
    """Preflight of the judge and the scorer endpoint(s) a run will call (not a scorer it serves itself)."""
    served = cfg.scorer.backend == "openai" and not serve_scorer
    preflight(
        [cfg.judge, cfg.scorer.endpoint if served else None], pool=cfg.scorer.endpoints if served else None
    )


def dry_run(
    paths: list[str],
    cfg: JudgeRunConfig,
    *,
    serve_scorer: str | None,
    allow_outside: tuple[str, ...],
    shard: ShardSpec | None = None,
) -> str:
    """What a run would do, checked as far as it can be without a paid call."""
    for folder in filter(None, [serve_scorer, cfg.scorer.checkpoint]):
        if not (Path(folder) / "config.json").is_file():
            raise JudgeRunError(
                f"{folder}: not a model checkpoint (no config.json); pass the folder a training run wrote (RUN/final)"
            )
    if serve_scorer:
        cfg.scorer.checkpoint = cfg.scorer.checkpoint or serve_scorer
    fingerprint = protocol_fingerprint(cfg)
    trajectories, load_errors, duplicates, found = load_all(paths, cfg, allow_outside, shard)
    if not found:
        raise JudgeRunError(nothing_found_message(paths, load_errors))
    out = run_folder(cfg, shard)
    check_fingerprint(out, fingerprint, record=False)
    index = ResumeIndex(read_verdicts(out / VERDICTS_FILE))
    todo = [t for t in trajectories if not index.done(t.task_id, t.agent, t.run)]
    check_endpoints(cfg, serve_scorer)
    shots = sum(t.num_screenshots for t in todo)
    per_trajectory = 2 if cfg.pipeline.outcome_mode == "cot" else None
    judge_calls = (
        f"{len(todo) * per_trajectory:,}"
        if per_trajectory
        else f"≥ {2 * len(todo):,} (one outcome call per key point)"
    )
    if cfg.scorer.backend == "none":
        judge_calls = f"{len(todo) * 2 + shots:,} (the judge scores every screenshot)"
    agents = sorted({t.agent or "(no agent name)" for t in trajectories})
    owned = f"shard {shard} owns {len(trajectories)} of {found}" if shard else f"{found}"
    lines = [
        f"dry run: {owned} trajectories found ({', '.join(agents)}), {len(trajectories) - len(todo)} already "
        f"judged in {out}, {len(todo)} to judge with {shots:,} screenshots",
        f"judge calls: {judge_calls} to {cfg.judge.model} at {cfg.judge.display_url}",
        f"unreadable: {len(load_errors)}; duplicates: {len(duplicates)}",
        *[f"  {e}" for e in load_errors[:20]],
        "endpoints reachable, keys accepted, models served; nothing was called",
    ]
    return "\n".join(lines)


def run_judge(
    paths: list[str],
    cfg: JudgeRunConfig,
    *,
    resume_from: str | None = None,
    serve_scorer: str | None = None,
    progress: bool = True,
    wait: bool = False,
    allow_outside: tuple[str, ...] = (),
    shard: ShardSpec | None = None,
) -> dict:
    """The whole ``keyshot judge`` run; returns the summary (also written to OUT, or with ``shard`` to
    ``OUT/shard-I-of-N``: join the shards with ``keyshot merge OUT``)."""
    t0 = time.perf_counter()
    out = run_folder(cfg, shard)
    if cfg.scorer.backend == "transformers":
        require_training_stack("scorer.backend=transformers (the in-process scorer)")
    if serve_scorer:
        cfg.scorer.checkpoint = cfg.scorer.checkpoint or serve_scorer
    fingerprint = protocol_fingerprint(cfg)
    trajectories, load_errors, duplicates, found = load_all(paths, cfg, allow_outside, shard)
    if not found:
        raise JudgeRunError(nothing_found_message(paths, load_errors))
    with RunLock(out, wait=wait, what="keyshot judge"):
        check_fingerprint(out, fingerprint)
        if shard:  # a shard without a summary has not finished: keyshot merge waits for it
            (out / SUMMARY_FILE).unlink(missing_ok=True)
        return _judge_locked(
            out,
            trajectories,
            load_errors,
            duplicates,
            cfg,
            t0,
            resume_from=resume_from,
            serve_scorer=serve_scorer,
            progress=progress,
            found=found,
            shard=shard,
        )


def _judge_locked(
    out: Path,
    trajectories: list[Trajectory],
    load_errors: list[TrajectoryError],
    duplicates: list[str],
    cfg: JudgeRunConfig,
    t0: float,
    *,
    resume_from: str | None,
    serve_scorer: str | None,
    progress: bool,
    found: int,
    shard: ShardSpec | None,
) -> dict:
    verdicts_path = out / VERDICTS_FILE
    left_out = 0
    if resume_from:
        _, left_out = import_reference(resume_from, verdicts_path, cfg.pipeline.threshold, trajectories)
    if verdicts_path.exists():  # cut a half-written last line now, even when nothing is left to judge
        VerdictWriter(verdicts_path).close()
    existing = read_verdicts(verdicts_path)
    index = ResumeIndex(existing)
    todo = [t for t in trajectories if not index.done(t.task_id, t.agent, t.run)]
    skipped = len(trajectories) - len(todo)
    if skipped:
        logger.info(
            "%d of %d trajectories already judged in %s; judging %d",
            skipped,
            len(trajectories),
            verdicts_path,
            len(todo),
        )

    if todo:  # before any server starts or any call is paid
        check_endpoints(cfg, serve_scorer)
    cache = CallCache(cfg.cache or out / CACHE_FILE)
    ledger = UsageLedger()
    server: VLLMServer | None = None
    done: list[Verdict] = []
    stop_error: RunStopError | None = None
    try:
        scorer_endpoint = None
        if serve_scorer and todo:
            serve_cfg = dataclasses.replace(cfg.scorer.serve or ServeConfig(), model=serve_scorer)
            serve_cfg.prompt_variant = cfg.pipeline.prompt_variant
            # the server's log beside the run, not in /tmp
            serve_cfg.log_file = serve_cfg.log_file or str(out / "vllm.log")
            server = VLLMServer(serve_cfg).start()
            base = cfg.scorer.endpoint
            scorer_endpoint = server.endpoint(
                **(
                    {
                        "max_concurrency": base.max_concurrency,
                        "max_tokens": base.max_tokens,
                        "timeout_s": base.timeout_s,
                    }
                    if base
                    else {}
                )
            )
        if todo:
            judge = JudgeClient(cfg.judge, cache, ledger)
            scorer = build_scorer(cfg, cache, ledger, scorer_endpoint)
            webjudge = WebJudge(judge, scorer, cfg.pipeline)
            with VerdictWriter(verdicts_path) as writer:
                done = asyncio.run(judge_all(webjudge, todo, writer, cfg.concurrency, progress=progress))
            stop_error = webjudge.stop_error
    finally:
        if server is not None:
            server.stop()
        cache.close()

    final = latest_verdicts(read_verdicts(verdicts_path))
    summary = summarize(
        final,
        run={
            "found": found,
            "shard": str(shard) if shard else None,
            "shard_by": cfg.shard_by if shard else None,
            "owned": len(trajectories),
            "judged": len(done),
            "skipped": skipped,
            "not_reached": len(todo) - len(done),
            "load_errors": len(load_errors),
            "load_error_messages": [str(e) for e in load_errors],
            "duplicates": duplicates,
            "resume_from_left_out": left_out,
            "seconds": time.perf_counter() - t0,
            "budget_stop": isinstance(stop_error, BudgetExceededError),
            "stopped": str(stop_error) if stop_error else None,
            "exit_code": stop_error.exit_code if stop_error else None,
            "ledger": ledger.as_dict(),
            "config": redact_config(config_to_dict(cfg)),
        },
    )
    write_text_atomic(out / SUMMARY_FILE, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    markdown = summary_markdown(summary, ledger.table() if ledger.names() else "")
    write_text_atomic(out / "summary.md", markdown)
    summary["markdown"] = markdown
    return summary


def exit_code(summary: dict) -> int:
    """The run's exit code (:mod:`infer.errors`): a stop's own code, 3 when incomplete, else 0."""
    if summary["run"].get("exit_code"):
        return summary["run"]["exit_code"]
    return EXIT_INCOMPLETE if summary["incomplete"] else EXIT_OK


# ---------------------------------------------------------------------------- CLI
def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "judge",
        help="run WebJudge over trajectories (resumable; verdicts.jsonl + summary)",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "items",
        nargs="*",
        metavar="TRAJ_PATH|key=value",
        help="trajectory folders/files, then config overrides",
    )
    p.add_argument("--config", help="YAML JudgeRunConfig (configs/judge/*.yaml)")
    p.add_argument("--out", help="output folder (same as out=...)")
    p.add_argument(
        "--resume-from", help="reference implementation output (JSONL / ARB records) to import first"
    )
    p.add_argument("--serve-scorer", metavar="CHECKPOINT", help="start vLLM for this checkpoint for the run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--agent",
        help="the agent's name for trajectories that do not record one (one agent's Online-Mind2Web folder)",
    )
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="judge a trajectory even when some screenshot calls failed (counted as score 0, as the "
        "reference does; recorded in each verdict) instead of marking it incomplete",
    )
    p.add_argument("--wait", action="store_true", help="wait for another process writing in --out")
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="judge only shard I of N (0-based; by a stable hash of the task id, or of the whole identity "
        "with shard_by=trajectory) into OUT/shard-I-of-N; join them with keyshot merge OUT",
    )
    p.add_argument(
        "--report", action="store_true", help="build the HTML report (keyshot report OUT) at the end"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check paths, the checkpoint and every endpoint, say what would be judged; call no model",
    )
    p.add_argument(
        "--allow-outside",
        action="append",
        default=[],
        metavar="DIR",
        help="also read screenshots that trajectory files reference inside DIR (default: only inside the "
        "input paths)",
    )
    p.set_defaults(func=run)


def split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """Trajectory paths and ``key=value`` overrides (an existing path is always a path)."""
    paths, overrides = [], []
    for item in items:
        if _OVERRIDE.match(item) and not Path(item).exists():
            overrides.append(item)
        else:
            paths.append(item)
    return paths, overrides


def run(args: argparse.Namespace) -> int:
    paths, overrides = split_items(args.items)
    if args.out:
        overrides.append(f"out={args.out}")
    if args.allow_partial:
        overrides.append("pipeline.allow_partial=true")
    if args.agent:
        overrides.append(f"agent={args.agent}")
    try:
        if not paths:
            raise JudgeRunError("no trajectory path given")
        shard = ShardSpec.parse(args.shard) if args.shard else None
        cfg = load_config(JudgeRunConfig, args.config, overrides)
        if args.dry_run:
            print(
                dry_run(
                    paths,
                    cfg,
                    serve_scorer=args.serve_scorer,
                    allow_outside=tuple(args.allow_outside),
                    shard=shard,
                )
            )
            return 0
        summary = run_judge(
            paths,
            cfg,
            resume_from=args.resume_from,
            serve_scorer=args.serve_scorer,
            progress=not args.no_progress,
            wait=args.wait,
            allow_outside=tuple(args.allow_outside),
            shard=shard,
        )
    except (
        ShardError,
        ConfigError,
        JudgeRunError,
        TrajectoryError,
        VerdictFileError,
        CheckpointError,
        CacheError,
        ServeError,
        ValueError,
    ) as exc:
        print(f"keyshot judge: {exc}", file=sys.stderr)
        return 2
    print(summary["markdown"])
    print(f"verdicts: {run_folder(cfg, shard) / VERDICTS_FILE}")
    if shard:
        report = " && keyshot report " + cfg.out if args.report else ""
        print(f"when every shard is done: keyshot merge {cfg.out}{report}")
    elif args.report:
        from infer.report import build_report

        with RunLock(Path(cfg.out) / "report", what="keyshot judge --report"):
            index = build_report(Path(cfg.out), Path(cfg.out) / "report", progress=not args.no_progress)
        print(f"report: {index}")
    else:
        print(f"browse it: keyshot report {cfg.out}")
    code = exit_code(summary)
    if summary["run"]["stopped"]:
        print(f"keyshot judge: stopped: {summary['run']['stopped']}", file=sys.stderr)
    elif code == EXIT_INCOMPLETE:
        print(
            f"keyshot judge: {summary['incomplete']} trajectories incomplete; re-run the same command to retry them",
            file=sys.stderr,
        )
    return code
