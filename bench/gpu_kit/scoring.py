"""The scorer rows: the in-process TransformersScorer's prefill against its compute ceiling, train/serve
parity, and the same model served by keyshot serve (vLLM) where it is available."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import random
import sys
import time
from pathlib import Path

import torch

from bench.gpu_kit.kit import KEY_POINTS, TASK, Kit, build_model, forward_counts, forward_flops, screenshots
from keyshot.infer.judge.local_scorer import TransformersScorer
from keyshot.infer.protocol.chat_template import ScorerRenderer, image_policy_for
from keyshot.infer.protocol.images import DEFAULT_POLICY, prepare_image
from keyshot.infer.protocol.messages import scorer_messages
from keyshot.infer.protocol.prompts import load_prompt_set

logger = logging.getLogger("bench.gpu")


def scorer_bench(kit: Kit, batch_sizes: list[int], reps: int) -> tuple[dict, object]:
    prompts = load_prompt_set()
    model = build_model(kit)
    scorer = TransformersScorer.from_model(
        model, kit.processor, prompts, DEFAULT_POLICY, device=str(kit.device), batch_size=max(batch_sizes)
    )
    images = screenshots(max(batch_sizes))
    one = scorer.encode(TASK, KEY_POINTS, images[:1])
    seq_len = int(one["input_ids"].shape[1])
    patches = int(one["image_grid_thw"].prod(dim=-1).sum())
    per_shot = forward_flops(kit, seq_len, patches)
    ceiling = kit.peak_tflops * 1e12 / per_shot
    encoded = {}
    for bs in batch_sizes:
        t0 = time.perf_counter()
        inputs = scorer.encode(TASK, KEY_POINTS, images[:bs])
        encoded[bs] = ((time.perf_counter() - t0) / bs, {k: v.to(kit.device) for k, v in inputs.items()})

    def measure(variant: str) -> list[dict]:
        out = []
        for bs, (prep, inputs) in encoded.items():
            with torch.inference_mode():
                scorer.model(**inputs, logits_to_keep=1)  # warm-up (and compilation)
                kit.sync()
                t0 = time.perf_counter()
                for _ in range(reps):
                    scorer.model(**inputs, logits_to_keep=1)
                kit.sync()
            per_s = bs * reps / (time.perf_counter() - t0)
            out.append(
                {
                    "variant": variant,
                    "batch": bs,
                    "screenshots_per_s": per_s,
                    "ceiling_fraction": per_s / ceiling,
                    "preprocess_s": prep,
                }
            )
        return out

    rows = measure("as served")
    variants: list[dict] = []
    failed: list[str] = []
    if kit.device.type == "cuda":  # the tower's and layers' speed switches on the scorer's model
        from keyshot.infer.model.vision_graphs import use_tower_cuda_graphs
        from keyshot.infer.model.vision_packing import grid_of
        from keyshot.infer.model.vision_varlen import use_varlen_vision_attention
        from keyshot.train.speedups import compile_layers

        grids = [grid_of(inputs["image_grid_thw"]) for _, inputs in encoded.values()]
        for name, apply in {
            "+ varlen tower windows": lambda: use_varlen_vision_attention(scorer.model),
            "+ torch.compile per layer and block": lambda: compile_layers(scorer.model),
            "+ the tower in CUDA graphs at these batches' grids": lambda: use_tower_cuda_graphs(
                scorer.model, grids
            ),
        }.items():
            try:
                apply()
                variants += measure(name)
            except Exception as exc:  # noqa: BLE001 (named in the results; the rows above stand)
                logger.exception("scorer variant %s failed", name)
                failed.append(f"{name}: {type(exc).__name__}: {exc}"[:400])
                break
    return {
        "head_flops_skipped": forward_counts(kit).batch_flops([seq_len], [patches]) - per_shot,
        "request_tokens": seq_len,
        "visual_tokens": int(patches // 4),
        "flops_per_screenshot": per_shot,
        "ceiling_screenshots_per_s": ceiling,
        "rows": rows,
        "variants": variants,
        "failed": failed,
        "parity": parity(scorer, kit),
    }, scorer.model


def parity(scorer: TransformersScorer, kit: Kit) -> dict:
    """One example through the training path and the scoring path: the same token ids and pixels."""
    from keyshot.infer.testing.scorer_data import screenshot

    prompts = load_prompt_set()
    image = prepare_image(screenshot(3, (1280, 720), random.Random(1)), DEFAULT_POLICY)
    messages = scorer_messages(prompts, TASK, KEY_POINTS, image.data_url)
    renderer = ScorerRenderer(kit.processor, image_policy_for(kit.processor), max_length=4096)
    train = renderer.render_prompt(messages, image.pil())
    serve = scorer.encode(TASK, KEY_POINTS, [image])
    same_ids = torch.equal(train["input_ids"].to(kit.device), serve["input_ids"].to(kit.device))
    same_pixels = torch.equal(train["pixel_values"].to(kit.device), serve["pixel_values"].to(kit.device))
    return {
        "token_ids_equal": same_ids,
        "pixels_equal": same_pixels,
        "tokens": int(serve["input_ids"].shape[1]),
    }


def vllm_row(kit: Kit, model, enabled: bool, n: int, tmp: Path) -> str:
    """Screenshots/s through ``keyshot serve`` (vLLM) over the same weights, ``max_tokens=1`` (prefill),
    ``n`` requests in flight; or why it was not measured."""
    import asyncio

    from keyshot.infer.client.judge_client import JudgeClient
    from keyshot.infer.judge.scorers import OpenAIScorer
    from keyshot.infer.model.checkpoint import write_scorer_meta
    from keyshot.infer.serve.plan import ServeConfig, vllm_python
    from keyshot.infer.serve.server import VLLMServer

    if not enabled:
        return "not run (--no-vllm)"
    python = vllm_python()
    if python == sys.executable and importlib.util.find_spec("vllm") is None:
        return "not installed"
    folder = tmp / "served"
    model.save_pretrained(folder)  # the one place the kit writes weights: vLLM loads from disk
    kit.processor.save_pretrained(folder)
    write_scorer_meta(folder, DEFAULT_POLICY, base_model=f"random weights, {kit.shape} shape (bench/gpu.py)")
    cfg = ServeConfig(
        model=str(folder),
        device=kit.device.type,
        dtype="bfloat16" if kit.dtype == torch.bfloat16 else "float32",
        max_model_len=4096,
        max_num_seqs=n,
        kv_cache_memory_bytes=None if kit.device.type == "cuda" else 1 << 30,
        enforce_eager=kit.device.type != "cuda",
        tmpdir=str(tmp / "vllm"),
        log_file=str(tmp / "vllm.log"),
    )
    images = screenshots(n)

    async def score(scorer: OpenAIScorer) -> float:
        await scorer.score_many(TASK, KEY_POINTS, images[: min(4, n)])  # warm-up
        t0 = time.perf_counter()
        results = await scorer.score_many(TASK, KEY_POINTS, images)
        failed = [r.error for r in results if r.error and not r.raw]
        if failed:
            raise RuntimeError(f"{len(failed)} vLLM scorer calls failed, e.g. {failed[0]}")
        return n / (time.perf_counter() - t0)

    server = VLLMServer(cfg).start()
    try:
        endpoint = server.endpoint(max_tokens=1, max_concurrency=n, timeout_s=900)
        per_s = asyncio.run(
            score(OpenAIScorer(JudgeClient(endpoint), load_prompt_set(), policy=DEFAULT_POLICY))
        )
    finally:
        server.stop()
    return f"{per_s:.2f} screenshots/s ({n} requests in flight, max_tokens 1)"
