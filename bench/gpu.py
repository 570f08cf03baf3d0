"""The GPU benchmark kit: training MFU, a per-phase step profile, scorer throughput against its compute
ceiling, and train/serve parity, at Qwen2.5-VL-7B's shape, in one command with nothing to download.

    python bench/gpu.py                    # on a CUDA machine: the 7B shape; writes bench/RESULTS-gpu.md
    python bench/gpu.py --shape tiny       # the same code paths with the tiny model (what CPU machines run)

The model is built from ``configs/models/qwen2.5-vl-7b.json`` with random bf16 weights created on the
device (no checkpoint is read or written); the processor and tokenizer are the tiny fixture's
(``keyshot.infer.model.tiny_model``) with the scorer's pixel bounds, so a 1280×720 screenshot is 1,196 visual tokens
as for the real model (text tokenises differently: the fixture's vocabulary is small; the counts are
printed). The training examples are rendered by train/batches.py (``ScorerRenderer``, ``ScorerCollator``,
the batch samplers), the model is set up by ``keyshot.train.scorer_model.prepare_for_training`` (frozen vision tower,
activation checkpointing, LoRA, batched vision windows), the optimizer is the recipe's AdamW over
``parameter_groups``, the logging is the recipe's ``ThroughputMeter``/``log_totals``.

**MFU** = model FLOPs per second ÷ the device's dense bf16 peak. Model FLOPs per micro-batch come from
``keyshot.train.throughput.FlopsModel`` on the real shapes: language model ``2·N_llm·tokens + 4·L·d·Σs²``,
vision tower ``2·N_vis·patches`` plus attention (``4·d_vis·n²`` per full-attention layer and
``4·d_vis·n·w`` per windowed layer, ``w`` = 64 patches), merger ``2·N_merger·patches/4``; times 3 where
gradients flow (full fine-tune: language model and merger), 2 for the language model under LoRA (input
gradients only) and 1 for the frozen vision tower. Recomputation under checkpointing is not counted.

**Phases** (``--profile``): each step is cut into data wait (the DataLoader), host→device copy, vision
forward (hooks on ``model.visual``), language-model forward (the rest of the forward), backward,
optimizer (clip, step, zero) and logging (the meter and the loss reduction), each closed by a device
synchronise; the shares are of the profiled step, and "unaccounted" is what no phase holds. Samples/s
and MFU come from separate, unsynchronised steps.

**Scorer**: the in-process ``TransformersScorer`` over the same model, prefill of batches of 1280×720
screenshots with the real scorer prompt (``logits_to_keep=1``), next to the ceiling: forward FLOPs of one
screenshot's request ÷ peak. With vLLM available (importable, or ``KEYSHOT_VLLM_PYTHON``) and ``--vllm``,
the model is saved and served by ``keyshot serve`` and scored over HTTP; otherwise that row says so.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import json
import logging
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python bench/gpu.py` from a checkout
    sys.path.insert(0, str(REPO))

from keyshot.infer.judge.local_scorer import TransformersScorer  # noqa: E402
from keyshot.infer.model.tiny_model import build_tiny_qwen25vl  # noqa: E402
from keyshot.infer.protocol.chat_template import (  # noqa: E402
    ScorerRenderer,
    image_policy_for,
    image_size,
    set_processor_pixel_bounds,
)
from keyshot.infer.protocol.images import DEFAULT_POLICY, prepare_image  # noqa: E402
from keyshot.infer.protocol.messages import scorer_messages  # noqa: E402
from keyshot.infer.protocol.prompts import load_prompt_set  # noqa: E402
from keyshot.infer.testing.scorer_data import scorer_rows  # noqa: E402
from keyshot.train.batches import ScorerCollator, build_batch_sampler  # noqa: E402
from keyshot.train.scorer_model import parameter_groups, prepare_for_training  # noqa: E402
from keyshot.train.throughput import FlopsModel, ThroughputMeter, batch_shape_stats, log_totals  # noqa: E402
from keyshot.train.train_config import LoraSettings, ModelSettings, OptimSettings  # noqa: E402

logger = logging.getLogger("bench.gpu")

SHAPE_7B = REPO / "configs" / "models" / "qwen2.5-vl-7b.json"
# Dense bf16 peak TFLOP/s by device name (first match wins): the vendors' data sheets, no sparsity.
PEAK_BF16_TFLOPS = [
    ("H200", 989.0),
    ("GH200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("A10G", 125.0),
]
# Online-Mind2Web screenshot sizes: mostly 1280×720, then 1080p, laptop, phone and a tall page.
SIZES = [(1280, 720)] * 6 + [(1920, 1080), (1366, 768), (390, 844), (1280, 2400)]
TASK = "Find a one-way flight from New York to London on the 3rd of next month under $600"
KEY_POINTS = "\n1. One-way\n2. New York to London\n3. The 3rd of next month\n4. Under $600"


# ----------------------------------------------------------------------------- the set-up
@dataclasses.dataclass
class Kit:
    device: torch.device
    dtype: torch.dtype
    shape: str
    processor: object
    fixture: Path
    peak_tflops: float
    peak_source: str

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def device_peak(device: torch.device, cpu_peak: float) -> tuple[float, str]:
    if device.type != "cuda":
        return cpu_peak, f"--cpu-peak {cpu_peak:g} (a nominal CPU figure, not a data sheet)"
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16_TFLOPS:
        if key in name:
            return peak, f"{key} dense bf16 data sheet"
    raise SystemExit(f"bench/gpu.py: no bf16 peak known for {name!r}; pass --peak TFLOPS")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "peft", "accelerate", "flash_attn", "vllm"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 (absent or broken: both are "not installed" here)
            out[name] = "not installed"
    out["cuda"] = torch.version.cuda or "none"
    return out


def model_config(kit: Kit, depth: int | None = None):
    """The shape's config with the fixture tokenizer's special ids (and ``depth`` decoder layers)."""
    from transformers import AutoConfig, Qwen2_5_VLConfig

    if kit.shape == "tiny":
        config = AutoConfig.from_pretrained(kit.fixture)
    else:
        data = {k: v for k, v in json.loads(SHAPE_7B.read_text()).items() if not k.startswith("_")}
        config = Qwen2_5_VLConfig(**data)
        tok = kit.processor.tokenizer
        ids = {
            t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>")
        }
        config.image_token_id = ids["<|image_pad|>"]
        config.video_token_id = ids["<|video_pad|>"]
        config.vision_start_token_id = ids["<|vision_start|>"]
        config.vision_end_token_id = tok.convert_tokens_to_ids("<|vision_end|>")
        text = config.get_text_config()
        text.bos_token_id = text.pad_token_id = tok.pad_token_id
        text.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    if depth is not None:
        text = config.get_text_config()
        text.num_hidden_layers = text.max_window_layers = depth
        if getattr(text, "layer_types", None):
            text.layer_types = text.layer_types[:depth]
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return config


def build_model(kit: Kit, depth: int | None = None):
    """Random weights created on the device, in the kit's dtype."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from keyshot.train.scorer_model import attention_implementation

    torch.manual_seed(0)
    config = model_config(kit, depth)
    with torch.device(kit.device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(
            config, dtype=kit.dtype, attn_implementation=attention_implementation("auto")
        )
    return model


# ----------------------------------------------------------------------------- training
class Rendered(torch.utils.data.Dataset):
    """Rows rendered on access by the training path (train/batches.py's ScorerRenderer)."""

    def __init__(self, rows: list[dict], renderer: ScorerRenderer):
        self.rows, self.renderer = rows, renderer
        self.lengths = [
            renderer.plan(i, r["messages"], image_size(r["image"])).length for i, r in enumerate(rows)
        ]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.renderer.render(self.rows[i]["messages"], self.rows[i]["image"])


class Phases:
    """Wall time per phase, each closed by a device synchronise (only while ``on``)."""

    def __init__(self, kit: Kit):
        self.kit, self.on, self.total = kit, False, {}
        self.vision_calls = 0
        self._vision_t0 = 0.0

    @contextlib.contextmanager
    def phase(self, name: str):
        if not self.on:
            yield
            return
        self.kit.sync()
        t0 = time.perf_counter()
        yield
        self.kit.sync()
        self.total[name] = self.total.get(name, 0.0) + time.perf_counter() - t0

    def hook(self, visual: torch.nn.Module) -> None:
        def before(*_):
            if self.on:
                self.kit.sync()
                self._vision_t0 = time.perf_counter()

        def after(*_):
            if self.on:
                self.kit.sync()
                self.total["vision forward"] = self.total.get("vision forward", 0.0) + (
                    time.perf_counter() - self._vision_t0
                )
                self.vision_calls += 1

        visual.register_forward_pre_hook(before)
        visual.register_forward_hook(after)


def train_bench(
    kit: Kit,
    rows: list[dict],
    *,
    mode: str,
    batching: str,
    batch: int,
    steps: int,
    depth: int | None,
    workers: int = 0,
    variant: str = "default",
) -> dict:
    """Steps of the recipe's work at one setting: unsynchronised (rates, MFU), then profiled (phases).

    ``variant`` (LoRA only, to find what LoRA's step costs): ``no-dropout`` (lora.dropout 0),
    ``no-checkpointing`` (model.gradient_checkpointing false), ``bf16-adapters`` (adapters in bfloat16,
    where peft keeps them in float32)."""
    processor = kit.processor
    renderer = ScorerRenderer(processor, image_policy_for(processor), max_length=4096)
    data = Rendered(rows, renderer)
    dropout = 0.0 if variant == "no-dropout" else 0.05
    lora = LoraSettings(enabled=mode == "lora", r=64, alpha=128, dropout=dropout)
    settings = ModelSettings(
        name_or_path="(random)", gradient_checkpointing=variant != "no-checkpointing", lora=lora
    )
    model = prepare_for_training(build_model(kit, depth), settings)
    if variant == "bf16-adapters":
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.data = param.data.to(kit.dtype)
    model.train()
    optim = OptimSettings(lr=1e-5 if mode == "full" else 1e-4)
    fused = {"fused": True} if kit.device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(parameter_groups(model, optim, 0.1), lr=optim.lr, **fused)
    trainable = [p for p in model.parameters() if p.requires_grad]
    sampler = build_batch_sampler(batching, data.lengths, batch, 1, 0, 1, 16)
    loader = torch.utils.data.DataLoader(
        data,
        batch_sampler=sampler,
        collate_fn=ScorerCollator(processor.tokenizer.pad_token_id, 8),
        num_workers=workers,  # the 7B configs render in 8 workers (data.num_workers), as the recipe does
        persistent_workers=workers > 0,
    )
    flops = FlopsModel.from_model(model, lora=mode == "lora", train_vision=False)
    meter = ThroughputMeter(flops, kit.peak_tflops, 1)
    phases = Phases(kit)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    phases.hook(base.model.visual if hasattr(base, "model") else base.visual)
    if kit.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(kit.device)

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    stream = batches()
    losses: list[torch.Tensor] = []
    # The recipe's Accelerator(mixed_precision="bf16") runs the forward under autocast (peft keeps the
    # adapters in float32: without autocast their products would run in float32).
    autocast = torch.autocast(kit.device.type, dtype=torch.bfloat16, enabled=kit.device.type == "cuda")
    llm_only = dataclasses.replace(flops, vision_factor=0.0, merger_factor=0.0)
    llm_flops = [0.0]

    def step() -> None:
        with phases.phase("data wait"):
            cpu_batch = next(stream)
        with phases.phase("host→device copy"):
            batch_ = {k: v.to(kit.device, non_blocking=True) for k, v in cpu_batch.items()}
        with phases.phase("forward"), autocast:
            loss = model(**batch_).loss
        with phases.phase("backward"):
            loss.backward()
        with phases.phase("optimizer"):
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        with phases.phase("logging"):
            losses.append(loss.detach().float())
            meter.add_batch(cpu_batch)
            if phases.on:
                llm_flops[0] += llm_only.batch_flops(*batch_shape_stats(cpu_batch)[:2])
            log_totals(losses, meter, kit.device).cpu()
            losses.clear()

    step()  # warm-up: kernels, allocator
    kit.sync()
    meter.reset()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    kit.sync()
    elapsed = time.perf_counter() - t0
    rates = meter.report()
    phases.on = True
    t1 = time.perf_counter()
    for _ in range(steps):
        step()
    profiled = time.perf_counter() - t1
    shares = {k: v / profiled for k, v in phases.total.items()}
    shares["language-model forward"] = shares.pop("forward", 0.0) - shares.get("vision forward", 0.0)
    shares["unaccounted"] = 1.0 - sum(shares.values())
    llm_seconds = (shares["language-model forward"] + shares.get("backward", 0.0)) * profiled
    return {
        "mode": mode if variant == "default" else f"{mode} ({variant})",
        "batching": batching,
        "micro_batch": batch,
        "workers": workers,
        "depth": model_config(kit, depth).get_text_config().num_hidden_layers,
        "samples_per_s": rates["samples_per_s"],
        "tokens_per_s": rates["tokens_per_s"],
        "step_s": elapsed / steps,
        "tflops_per_s": rates["tflops_per_s"],
        "mfu": rates["mfu"],
        "padding": rates["padding_fraction"],
        "peak_mem_gib": torch.cuda.max_memory_allocated(kit.device) / 2**30
        if kit.device.type == "cuda"
        else None,
        "phases": shares,
        # the language model's counted FLOPs over its forward and the backward (recompute included)
        "llm_mfu": llm_flops[0] / max(llm_seconds, 1e-9) / (kit.peak_tflops * 1e12),
        "vision_calls_per_step": phases.vision_calls / steps,
        "profiled_step_s": profiled / steps,
    }


def train_fitting(
    kit: Kit,
    rows: list[dict],
    *,
    mode: str,
    batching: str,
    batch: int,
    steps: int,
    workers: int = 0,
    variant: str = "default",
) -> dict:
    """:func:`train_bench` at full depth, else at half the decoder layers until it fits (said in the row)."""
    full = model_config(kit).get_text_config().num_hidden_layers
    depth = full
    while True:
        try:
            row = train_bench(
                kit,
                rows,
                mode=mode,
                batching=batching,
                batch=batch,
                steps=steps,
                depth=depth,
                workers=workers,
                variant=variant,
            )
            row["full_depth"] = full
            return row
        except torch.OutOfMemoryError:
            pass
        gc.collect()  # out of the except block: the failed attempt's frames (and tensors) are gone
        if kit.device.type == "cuda":
            torch.cuda.empty_cache()
        if depth <= 2:
            return {"mode": mode, "batching": batching, "micro_batch": batch, "oom": True, "full_depth": full}
        logger.warning("%s at %d of %d layers does not fit: trying %d", mode, depth, full, depth // 2)
        depth //= 2


# ----------------------------------------------------------------------------- the vision tower
def vision_bench(kit: Kit, batch_sizes: list[int], reps: int) -> dict:
    """The vision tower alone at the shape's size: transformers' per-window loop against keyshot's batched
    windows (``use_batched_window_attention``), screenshots/s at each batch of 1280×720 screenshots, the
    share of the peak on the tower's linear layers, and how far the two outputs are apart."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from keyshot.infer.model.vision_attention import (
        use_batched_window_attention,
        use_linear_patch_embed,
        use_padded_vision_mlp,
    )

    torch.manual_seed(0)
    config = model_config(kit).vision_config
    with torch.device(kit.device):
        tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(
            config, dtype=kit.dtype, attn_implementation="sdpa"
        ).eval()
    linear_params = sum(m.weight.numel() for m in tower.modules() if isinstance(m, torch.nn.Linear))
    images = [img.pil() for img in screenshots(max(batch_sizes))]
    inputs = kit.processor.image_processor(images=images, return_tensors="pt")
    pixels = inputs["pixel_values"].to(kit.device, kit.dtype)
    grid = inputs["image_grid_thw"].to(kit.device)
    patches_per_image = int(grid[0].prod())

    def run(n: int) -> torch.Tensor:
        rows = int(grid[:n].prod(dim=-1).sum())
        return tower(pixels[:rows], grid_thw=grid[:n])

    def unwrap(out):
        return out.pooler_output if hasattr(out, "pooler_output") else out

    def rate(n: int) -> float:
        with torch.inference_mode():
            run(n)  # warm-up
            kit.sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                run(n)
            kit.sync()
        return n * reps / (time.perf_counter() - t0)

    result: dict = {"patches_per_image": patches_per_image, "rows": [], "variants": []}
    probe = min(2, max(batch_sizes))
    with torch.inference_mode():
        reference = unwrap(run(probe)).float()
    flops = 2 * linear_params * patches_per_image

    def measure(name: str) -> None:
        with torch.inference_mode():
            out = unwrap(run(probe)).float()
        rates = {n: rate(n) for n in batch_sizes}
        result["variants"].append(
            {
                "name": name,
                "max_abs_diff": float((out - reference).abs().max()),
                "rates": rates,
                "linear_mfu": {n: r * flops / (kit.peak_tflops * 1e12) for n, r in rates.items()},
            }
        )

    measure("transformers' per-window loop")
    result["patched_layers"] = use_batched_window_attention(tower)
    measure("batched windows")
    use_linear_patch_embed(tower)
    measure("+ patch embedding as one matrix product")
    use_padded_vision_mlp(tower)
    measure("+ MLP padded to 128, gate and up in one product")
    result["ref_abs_max"] = float(reference.abs().max())
    if kit.device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(max(batch_sizes))
            kit.sync()
        result["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18)
        logger.info("vision tower profile (last variant, batch %d):\n%s", max(batch_sizes), result["profile"])
    if kit.device.type == "cuda":
        result["peak_mem_gib"] = torch.cuda.max_memory_allocated(kit.device) / 2**30
    return result


# ----------------------------------------------------------------------------- scoring
def screenshots(n: int) -> list:
    from keyshot.infer.testing.scorer_data import screenshot

    rng = random.Random(0)
    return [
        prepare_image(screenshot(rng.choice([1, 3, 5]), (1280, 720), rng), DEFAULT_POLICY) for _ in range(n)
    ]


def forward_flops(model, seq_len: int, patches: int) -> float:
    """Forward FLOPs of one request (FlopsModel with every factor 1: no backward)."""
    fm = FlopsModel.from_model(model, lora=False, train_vision=False)
    fm = dataclasses.replace(fm, llm_factor=1.0, vision_factor=1.0, merger_factor=1.0)
    return fm.batch_flops([seq_len], [patches])


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
    per_shot = forward_flops(scorer.model, seq_len, patches)
    ceiling = kit.peak_tflops * 1e12 / per_shot
    rows = []
    for bs in batch_sizes:
        t0 = time.perf_counter()
        inputs = scorer.encode(TASK, KEY_POINTS, images[:bs])
        prep = (time.perf_counter() - t0) / bs
        inputs = {k: v.to(kit.device) for k, v in inputs.items()}
        with torch.inference_mode():
            scorer.model(**inputs, logits_to_keep=1)  # warm-up
            kit.sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                scorer.model(**inputs, logits_to_keep=1)
            kit.sync()
        per_s = bs * reps / (time.perf_counter() - t0)
        rows.append(
            {
                "batch": bs,
                "screenshots_per_s": per_s,
                "ceiling_fraction": per_s / ceiling,
                "preprocess_s": prep,
            }
        )
    return {
        "request_tokens": seq_len,
        "visual_tokens": int(patches // 4),
        "flops_per_screenshot": per_shot,
        "ceiling_screenshots_per_s": ceiling,
        "rows": rows,
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
    from keyshot.infer.serve.command import VLLMServer
    from keyshot.infer.serve.plan import ServeConfig, vllm_python

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


# ----------------------------------------------------------------------------- report
def markdown(
    kit: Kit,
    info: dict,
    train_rows: list[dict],
    scoring: dict | None,
    command: str,
    vision: dict | None = None,
    errors: dict[str, str] | None = None,
) -> str:
    lines = [
        "# keyshot GPU benchmark kit (bench/gpu.py)",
        "",
        f"Device: **{info['device']}**; peak {kit.peak_tflops:g} TFLOP/s ({kit.peak_source}); shape `{kit.shape}`, "
        f"dtype {str(kit.dtype).removeprefix('torch.')}. Command: `{command}`. {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        "",
        "## Training (recipe pieces: renderer, collator, sampler, prepare_for_training, AdamW, meter)",
        "",
        "| mode | batching | micro-batch | depth | samples/s | tokens/s | step s | TFLOP/s | MFU | padding | peak GiB |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in train_rows:
        if r.get("oom"):
            lines.append(
                f"| {r['mode']} | {r['batching']} | {r['micro_batch']} | does not fit | | | | | | | |"
            )
            continue
        depth = f"{r['depth']}/{r['full_depth']}" + (
            " (reduced: full depth does not fit)" if r["depth"] < r["full_depth"] else ""
        )
        mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "n/a"
        lines.append(
            f"| {r['mode']} | {r['batching']} | {r['micro_batch']} | {depth} | {r['samples_per_s']:.2f} | "
            f"{r['tokens_per_s']:,.0f} | {r['step_s']:.3f} | {r['tflops_per_s']:.3g} | {100 * r['mfu']:.1f}% | "
            f"{100 * r['padding']:.1f}% | {mem} |"
        )
    lines += [
        "",
        "### Where a training step's time goes (profiled steps, each phase closed by a synchronise)",
        "",
    ]
    names = [
        "data wait",
        "host→device copy",
        "vision forward",
        "language-model forward",
        "backward",
        "optimizer",
        "logging",
        "unaccounted",
    ]
    lines.append(
        "| mode | batching | "
        + " | ".join(names)
        + " | profiled step s | vision forwards/step | LM fwd+bwd MFU |"
    )
    lines.append("|---|---|" + "---:|" * (len(names) + 3))
    for r in train_rows:
        if r.get("oom"):
            continue
        cells = " | ".join(f"{100 * r['phases'].get(n, 0.0):.1f}%" for n in names)
        lines.append(
            f"| {r['mode']} | {r['batching']} | {cells} | {r['profiled_step_s']:.3f} | {r['vision_calls_per_step']:.1f} "
            f"| {100 * r['llm_mfu']:.1f}% |"
        )
    if scoring:
        lines += [
            "",
            "## Scoring (in-process TransformersScorer, prefill, 1280×720, the real scorer prompt)",
            "",
            f"One request: {scoring['request_tokens']:,} tokens ({scoring['visual_tokens']:,} visual), "
            f"{scoring['flops_per_screenshot'] / 1e12:.2f} TFLOP forward; compute ceiling "
            f"{scoring['ceiling_screenshots_per_s']:.1f} screenshots/s.",
            "",
            "| back-end | batch | screenshots/s | of the ceiling | CPU preprocessing s/screenshot |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in scoring["rows"]:
            lines.append(
                f"| transformers | {r['batch']} | {r['screenshots_per_s']:.2f} | {100 * r['ceiling_fraction']:.1f}% | {r['preprocess_s']:.4f} |"
            )
        lines.append(f"| vLLM (keyshot serve) | | {scoring['vllm']} | | |")
        p = scoring["parity"]
        lines += [
            "",
            f"Train/serve parity on {info['device']}: token ids {'identical' if p['token_ids_equal'] else 'DIFFER'}, "
            f"pixel tensors {'identical' if p['pixels_equal'] else 'DIFFER'} ({p['tokens']:,} tokens).",
        ]
    if vision:
        sizes = list(vision["variants"][0]["rates"]) if vision.get("variants") else []
        lines += [
            "",
            "## Vision tower alone (1280×720 screenshots, the shape's tower, inference)",
            "",
            f"{vision['patches_per_image']:,} patches per screenshot; each row adds one change to the row above; "
            f"|difference| is the largest against transformers' output (which reaches {vision['ref_abs_max']:.3g}).",
            "",
            "| variant | |difference| | "
            + " | ".join(f"batch {n}: screenshots/s (linear-layer MFU)" for n in sizes)
            + " |",
            "|---|---:|" + "---:|" * len(sizes),
        ]
        for v in vision.get("variants", []):
            cells = " | ".join(f"{v['rates'][n]:.2f} ({100 * v['linear_mfu'][n]:.1f}%)" for n in sizes)
            lines.append(f"| {v['name']} | {v['max_abs_diff']:.3g} | {cells} |")
        if vision.get("profile"):
            lines += [
                "",
                "Kernels of the last variant (torch.profiler, CUDA time):",
                "",
                "```",
                vision["profile"],
                "```",
            ]
    if errors:
        lines += ["", "## Sections that failed", ""]
        lines += [f"- {name}: `{message}`" for name, message in errors.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=("7b", "tiny"), help="default: 7b on CUDA, tiny elsewhere")
    ap.add_argument("--device", help="default: cuda when available, else cpu")
    ap.add_argument("--steps", type=int, default=8, help="measured steps per setting (and as many profiled)")
    ap.add_argument("--rows", type=int, default=64, help="training examples rendered")
    ap.add_argument("--batch", type=int, default=4, help="micro-batch (the paper recipe: 4 per GPU)")
    ap.add_argument("--modes", default="full,lora")
    ap.add_argument("--batchings", default="length_grouped,random")
    ap.add_argument("--score-batches", default="1,8,16,32")
    ap.add_argument("--score-reps", type=int, default=3)
    ap.add_argument("--peak", type=float, help="device peak TFLOP/s (default: from the device name)")
    ap.add_argument(
        "--cpu-peak", type=float, default=0.2, help="nominal CPU TFLOP/s for the tiny shape's MFU"
    )
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument(
        "--lora-variants", default="", help="extra LoRA rows: no-dropout, no-checkpointing, bf16-adapters"
    )
    ap.add_argument("--vision-batches", default="1,8,16", help="vision tower alone ('' to skip)")
    ap.add_argument(
        "--workers", type=int, help="DataLoader workers (default: 8 on CUDA as the 7B configs, else 0)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS-gpu.md")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = args.shape or ("7b" if device.type == "cuda" else "tiny")
    peak, source = (args.peak, "--peak") if args.peak else device_peak(device, args.cpu_peak)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    workers = args.workers if args.workers is not None else (8 if device.type == "cuda" else 0)
    command = "python bench/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    train_rows: list[dict] = []
    scoring: dict | None = None
    vision: dict | None = None
    errors: dict[str, str] = {}

    def save() -> None:
        """Written after every section: a run cut short by its time limit keeps what it measured."""
        text = markdown(kit, info, train_rows, scoring, command.strip(), vision, errors)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        if args.json:
            data = {
                "info": info,
                "training": train_rows,
                "scoring": scoring,
                "vision": vision,
                "errors": errors,
            }
            args.json.write_text(json.dumps(data, indent=2, default=str))

    def section(name: str, work) -> object:
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 (one section's failure is reported; the others still run)
            logger.exception("%s failed", name)
            errors[name] = f"{type(exc).__name__}: {exc}"[:500]
            return None
        finally:
            gc.collect()  # the section's model and optimizer (peft makes reference cycles)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            save()

    with tempfile.TemporaryDirectory(prefix="keyshot-gpu-kit-") as tmp:
        from transformers import AutoProcessor

        fixture = build_tiny_qwen25vl(Path(tmp) / "fixture")
        processor = AutoProcessor.from_pretrained(fixture)
        set_processor_pixel_bounds(processor, DEFAULT_POLICY.min_pixels, DEFAULT_POLICY.max_pixels)
        kit = Kit(device, dtype, shape, processor, fixture, peak, source)
        info = {
            "device": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or "CPU",
            "versions": versions(),
            "workers": workers,
        }
        if args.vision_batches:
            logger.info("vision tower")
            vision_sizes = [int(b) for b in args.vision_batches.split(",")]
            vision = section("vision tower", lambda: vision_bench(kit, vision_sizes, args.score_reps))
        rows = list(scorer_rows(args.rows, seed=0, agent="bench", sizes=SIZES))
        for mode in args.modes.split(","):
            for batching in args.batchings.split(","):
                logger.info("training: %s, %s, micro-batch %d", mode, batching, args.batch)
                row = section(
                    f"training {mode} {batching}",
                    lambda mode=mode, batching=batching: train_fitting(
                        kit,
                        rows,
                        mode=mode,
                        batching=batching,
                        batch=args.batch,
                        steps=args.steps,
                        workers=workers,
                    ),
                )
                if row is not None:
                    train_rows.append(row)
        for variant in [v for v in args.lora_variants.split(",") if v]:
            logger.info("training: lora (%s)", variant)
            row = section(
                f"training lora {variant}",
                lambda variant=variant: train_fitting(
                    kit,
                    rows,
                    mode="lora",
                    batching=args.batchings.split(",")[0],
                    batch=args.batch,
                    steps=args.steps,
                    workers=workers,
                    variant=variant,
                ),
            )
            if row is not None:
                train_rows.append(row)
        logger.info("scoring")
        batches = [int(b) for b in args.score_batches.split(",") if b]

        def score_all() -> dict:
            result, model = scorer_bench(kit, batches, args.score_reps)
            result["vllm"] = vllm_row(kit, model, not args.no_vllm, max(batches), Path(tmp))
            return result

        if batches:
            scoring = section("scoring", score_all)
    save()
    print(args.out.read_text())
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
