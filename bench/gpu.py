"""The GPU benchmark kit: the recipe's training step timed and profiled, scorer throughput against its compute
ceiling, the vision tower, and train/serve parity, at Qwen2.5-VL-7B's shape, in one command with nothing
to download.

    python -m bench.gpu                    # on a CUDA machine: the 7B shape; writes bench/RESULTS-gpu.md
    python -m bench.gpu --shape tiny       # the same code paths with the tiny model (what CPU machines run)
    bash bench/gpu_session.sh OUT          # on a lent GPU: the CUDA tests, then this kit (issue 57's rows)

The model is built from ``configs/models/qwen2.5-vl-7b.json`` with random bf16 weights created on the
device (no checkpoint is read or written); the processor and tokenizer are the tiny fixture's
(``keyshot.infer.model.tiny_model``) with the scorer's pixel bounds, so a 1280×720 screenshot is 1,196
visual tokens as for the real model (text tokenises differently: the fixture's vocabulary is small; the
counts are printed).

**Training rows measure the recipe.** Each row is a shipped 7B config (``configs/train/webjudge7b_*.yaml``)
with ``key=value`` overrides of its ``model:`` section; the rows are rendered by train/batches.py
(``ScorerRenderer``, ``ScorerCollator``, the batch samplers), the model is set up by
``keyshot.train.scorer_model.prepare_for_training`` and each micro-batch runs the recipe's own
``keyshot.train.step.train_step`` (accelerate's accumulation and autocast, the memory plan, the loss at the
labelled positions, the clipped AdamW of ``build_optimizer``), never a copy of it. The optimizer step is
amortised over the recipe's accumulation, as a run pays it.

**Timing that agrees with the profile.** One window of micro-batches is drawn once from the sampler; a
warm-up runs every shape bucket of it (and an optimizer step); the timed passes and the profiled pass run
those same batches, garbage collection off. A timed pass marks every step with CUDA events (the host's
clock on a CPU) and never synchronises; the profiled pass closes each phase (host→device copy, vision
forward, language-model forward and backward, vision backward, optimizer, logging) with a synchronise.
Each row prints its timed step over its profiled step and says so where they are more than 5 % apart.

**MFU** = model FLOPs per second ÷ the device's dense bf16 peak, FLOPs from
``keyshot.train.throughput.FlopsModel`` on the batches run (``lm_head`` only at labelled positions, LoRA's
language model at 4N, the frozen tower once); HFU adds what checkpointing recomputes.

**Scorer**: the in-process ``TransformersScorer`` over the same model, prefill of batches of 1280×720
screenshots with the real scorer prompt (``logits_to_keep=1``), next to the ceiling: forward FLOPs of one
screenshot's request ÷ peak. With vLLM available (importable, or ``KEYSHOT_VLLM_PYTHON``) and without
``--no-vllm``, the model is saved and served by ``keyshot serve`` and scored over HTTP; otherwise that row
says so.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.record import REPO, commit
from keyshot.infer.common.config import load_config
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.judge.local_scorer import TransformersScorer
from keyshot.infer.model.tiny_model import build_tiny_qwen25vl
from keyshot.infer.protocol.chat_template import (
    ScorerRenderer,
    image_policy_for,
    image_size,
    set_processor_pixel_bounds,
)
from keyshot.infer.protocol.images import DEFAULT_POLICY, prepare_image
from keyshot.infer.protocol.messages import scorer_example, scorer_messages
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.scorer_data import scorer_rows
from keyshot.train.batches import ScorerCollator, build_batch_sampler
from keyshot.train.memory_plan import CheckpointPlan, batch_token_slots, describe_plan
from keyshot.train.scorer_model import prepare_for_training
from keyshot.train.speedups import decoder_layers
from keyshot.train.step import build_optimizer, train_step
from keyshot.train.throughput import (
    FlopsModel,
    ThroughputMeter,
    batch_shape_stats,
    labelled_tokens,
    log_totals,
)
from keyshot.train.train_config import ModelSettings, TrainConfig

logger = logging.getLogger("bench.gpu")

SHAPE_7B = REPO / "configs" / "models" / "qwen2.5-vl-7b.json"
# Dense bf16 peak TFLOP/s by device name (first match wins): the vendors' data sheets, no sparsity.
# The NVL (PCIe-card) parts run at lower clocks than the SXM modules whose plain names they extend, so
# they come first: "NVIDIA H200 NVL" is 835, "NVIDIA H200" (SXM) 989.
PEAK_BF16_TFLOPS = [
    ("H200 NVL", 835.0),
    ("GH200", 989.0),
    ("H200", 989.0),
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

    @property
    def mixed_precision(self) -> str:
        """The shipped 7B configs' ``mixed_precision`` on a GPU (bf16 autocast); the tiny shape's float32 elsewhere."""
        return "bf16" if self.device.type == "cuda" else "no"


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
    for name in ("transformers", "peft", "accelerate", "liger-kernel", "triton", "flash-attn", "vllm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
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
    """Rows planned and rendered by the training path (train/batches.py's ScorerRenderer): a row longer than
    the renderer's max_length is shrunk by its plan, as the recipe's dataset does."""

    def __init__(self, rows: list[dict], renderer: ScorerRenderer):
        self.rows, self.renderer = rows, renderer
        self.plans = [renderer.plan(i, r["messages"], image_size(r["image"])) for i, r in enumerate(rows)]
        self.lengths = [plan.length for plan in self.plans]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        return self.renderer.render(row["messages"], row["image"], self.plans[i].max_pixels)


def _with_key_points(row: dict, extra: int, prompts) -> dict:
    """``row`` with ``extra`` more key points (its messages rebuilt the way the dataset builds them)."""
    points = row["key_points"] + "".join(f"\n{n + 5}. {KEY_POINT_FILLER}" for n in range(extra))
    return {
        **row,
        "key_points": points,
        "messages": scorer_example(prompts, row["task"], points, row["answer"]),
    }


def long_rows(rows: list[dict], renderer: ScorerRenderer, tokens: int) -> list[dict]:
    """``rows`` with key points added until each is planned at about ``tokens`` tokens (with ``tokens`` the
    renderer's max_length, the length plan shrinks the image of a row that passes it, as in a real dataset):
    the rows a token cap is measured at."""
    prompts = load_prompt_set()

    def length(row: dict) -> int:
        plan = renderer.plan(0, row["messages"], image_size(row["image"]))
        return getattr(plan, "length", tokens + 1)  # a dropped row (its text alone too long) is too long

    out = []
    for row in rows:
        base = length(row)
        per_point = max(1.0, (length(_with_key_points(row, 8, prompts)) - base) / 8)
        extra = max(0, int((tokens - base) / per_point))
        while extra and length(_with_key_points(row, extra, prompts)) > tokens:
            extra -= 1
        out.append(_with_key_points(row, extra, prompts))
    return out


class StepClock:
    """Per-step timestamps: CUDA events on the device's stream (no synchronise until read), the host's
    clock elsewhere (the CPU runs the step as it is launched)."""

    def __init__(self, kit: Kit):
        self.cuda = kit.device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        """Between two marks (on CUDA: after the events completed, i.e. after a synchronise)."""
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


@contextlib.contextmanager
def gc_frozen():
    """No garbage collection inside the timed and profiled windows (peft makes reference cycles: a
    collection in the middle of a window is a pause no step of the recipe has on average)."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def shape_key(batch: dict) -> tuple:
    """A batch's shape bucket: its token slots and image grids (a new one may compile or autotune)."""
    return tuple(batch["input_ids"].shape), tuple(map(tuple, batch["image_grid_thw"].tolist()))


class Phases:
    """The step's parts (train/step.py's ``phase`` names, the host→device copy and the logging) in one of
    two modes. ``"profile"``: wall time per phase, each closed by a device synchronise; the tower's forward
    is timed by hooks on ``model.visual``, its backward (the merger's, and the tower's when it trains) from
    the gradient's arrival at the tower's output to the backward's end (the tower runs first, so its
    backward runs last), and the language model's phases exclude both. ``"timed"``: only the optimizer's
    part, between two marks of the step clock (no synchronise), to amortise it as the recipe does."""

    def __init__(self, kit: Kit):
        self.kit, self.mode, self.total = kit, None, {}
        self.clock = StepClock(kit)
        self.optimizer_marks: list = []
        self.vision_calls = 0
        self._vision_t0 = 0.0
        self.vision_grad_at: float | None = None

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.mode == "timed" and name == "optimizer":
            start = self.clock.mark()
            yield
            self.optimizer_marks.append((start, self.clock.mark()))
            return
        if self.mode != "profile":
            yield
            return
        self.kit.sync()
        t0 = time.perf_counter()
        yield
        self.kit.sync()
        self.total[name] = self.total.get(name, 0.0) + time.perf_counter() - t0
        if name == "backward" and self.vision_grad_at is not None:  # its tail is the tower's
            share = time.perf_counter() - self.vision_grad_at
            self.total["vision backward"] = self.total.get("vision backward", 0.0) + share
        if name == "backward":
            self.vision_grad_at = None

    def optimizer_seconds(self) -> float:
        seconds = sum(self.clock.seconds(a, b) for a, b in self.optimizer_marks)
        self.optimizer_marks.clear()
        return seconds

    def hook(self, visual: torch.nn.Module) -> None:
        def before(*_):
            if self.mode == "profile":
                self.kit.sync()
                self._vision_t0 = time.perf_counter()

        def grad_arrived(grad):
            if self.mode == "profile":
                self.kit.sync()
                self.vision_grad_at = time.perf_counter()
            return grad

        def after(_module, _args, output):
            if self.mode == "profile":
                self.kit.sync()
                self.total["vision forward"] = self.total.get("vision forward", 0.0) + (
                    time.perf_counter() - self._vision_t0
                )
                self.vision_calls += 1
                tensor = getattr(output, "pooler_output", None)
                tensor = tensor if tensor is not None else getattr(output, "last_hidden_state", output)
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(grad_arrived)

        visual.register_forward_pre_hook(before)
        visual.register_forward_hook(after)


#: The shipped 7B training configs whose ``model:`` section a training row measures.
TRAIN_CONFIGS = {
    "lora": REPO / "configs" / "train" / "webjudge7b_lora.yaml",
    "full": REPO / "configs" / "train" / "webjudge7b_full.yaml",
}
#: The rows issue 57 measures: the shipped LoRA config; fused adapters checkpointing every layer, then every
#: second; fused adapters without checkpointing at the shipped cap (8,192 token slots: 2 rows of 4,096) and at
#: 16,384 (4 rows of 4,096, a 141 GB card's); the full fine-tune (its optimizer amortised as the recipe's).
DEFAULT_TRAIN = ";".join(
    [
        "lora",
        "lora+fused=lora:lora.fused=true,unchecked_token_cap=null,checkpoint_every=1",
        "lora+fused, checkpoint_every 2=lora:lora.fused=true,unchecked_token_cap=null,checkpoint_every=2",
        "lora+fused, no checkpointing at 8,192=lora@4096:lora.fused=true,unchecked_token_cap=8192",
        "lora+fused, no checkpointing at 16,384=lora@4096:lora.fused=true,unchecked_token_cap=16384",
        "full",
    ]
)
#: A key point of the long rows (``LABEL=MODE@TOKENS``): rows planned at a token cap's length.
KEY_POINT_FILLER = "The page shows the chosen item with its price, its options and the button to buy it"


@dataclasses.dataclass(frozen=True)
class TrainSetting:
    """One training row: a shipped config (``mode``) with ``key=value`` overrides of its ``model:`` section
    (the one override convention), under a label; ``row_tokens``: rows lengthened to that many tokens."""

    label: str
    mode: str
    overrides: tuple[str, ...] = ()
    row_tokens: int | None = None

    @classmethod
    def parse(cls, text: str) -> TrainSetting:
        """``lora``, ``full``, or ``LABEL=MODE[@TOKENS]:key=value,key=value``
        (``nockpt=lora:gradient_checkpointing=false``; ``cap=lora@4096:unchecked_token_cap=16384``)."""
        label, _, rest = text.partition("=") if ":" in text or "@" in text else (text, "", text)
        mode, _, overrides = rest.partition(":")
        mode, _, tokens = mode.partition("@")
        if mode not in TRAIN_CONFIGS or (tokens and not tokens.isdigit()):
            raise SystemExit(
                f"bench/gpu.py: training setting {text!r}: the mode must be one of {sorted(TRAIN_CONFIGS)}, "
                "optionally with @TOKENS (rows of that many tokens)"
            )
        items = tuple(o.strip() for o in overrides.split(",") if o.strip())
        return cls(
            label=label if rest != text else mode,
            mode=mode,
            overrides=items,
            row_tokens=int(tokens or 0) or None,
        )

    def config(self, device: torch.device) -> tuple[TrainConfig, list[str]]:
        """The row's training config, and what the device could not run: off the GPU the switches that need
        CUDA (Liger's Triton kernels, torch's varlen attention) are turned off and named."""
        cfg = load_config(TrainConfig, TRAIN_CONFIGS[self.mode], [f"model.{o}" for o in self.overrides])
        settings = dataclasses.replace(cfg.model, name_or_path="(random)")
        dropped: list[str] = []
        if device.type != "cuda":
            off = {"liger_kernel": False, "vision_attention": "batched"}
            dropped = [f"{k}={v}" for k, v in off.items() if getattr(settings, k) != v]
            settings = dataclasses.replace(settings, **off)
        return dataclasses.replace(cfg, model=settings), dropped


def micro_batch(cfg: TrainConfig, row_tokens: int | None, asked: int | None) -> int:
    """A row's micro-batch: ``asked``, else for long rows (``row_tokens`` token slots each, padded) as many as
    the config's token cap holds (``model.unchecked_token_cap``), else the config's ``per_device_batch_size``;
    always a divisor of the global batch (the recipe's accumulation must divide)."""
    cap = cfg.model.unchecked_token_cap
    wanted = asked or (max(1, cap // row_tokens) if row_tokens and cap else cfg.per_device_batch_size)
    return max(b for b in range(1, wanted + 1) if cfg.global_batch_size % b == 0)


def recomputed_share(settings: ModelSettings, plan: CheckpointPlan | None, model, batch: dict) -> float:
    """The share of the decoder layers whose forward the backward recomputes for ``batch``."""
    if plan is not None:
        return sum(plan.layers_checkpointed(batch["input_ids"].numel())) / len(plan.layers)
    layers = decoder_layers(model)
    if not settings.gradient_checkpointing:
        return 0.0
    return sum(bool(getattr(m, "gradient_checkpointing", False)) for m in layers) / len(layers)


def _spread(values: list[float]) -> dict:
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"median": median, "min": ordered[0], "max": ordered[-1]}


#: How far a row's timed step may be from its profiled step before the row says so.
TIMING_TOLERANCE = 0.05


def train_bench(
    kit: Kit,
    rows: list[dict],
    *,
    setting: TrainSetting,
    batching: str,
    batch: int | None,
    steps: int,
    warmup: int,
    repeats: int,
    depth: int | None,
    workers: int = 0,
) -> dict:
    """The recipe's step (``keyshot.train.step.train_step`` with ``build_optimizer``, under accelerate as the
    recipe runs it) at one setting, over one window of ``steps`` micro-batches drawn once from the recipe's
    sampler: a warm-up until every shape bucket of the window ran (and at least ``warmup`` steps, an optimizer
    step last), ``repeats`` timed passes over the window (per-step marks of the step clock, no synchronise),
    then one profiled pass over the same batches (phases). Each pass accumulates its ``steps`` micro-batches
    and steps the optimizer once at its end; the step time amortises that optimizer step over the recipe's
    own accumulation (``global_batch_size / per_device_batch_size`` on one rank: the full fine-tune's 16 of
    its 4 GPUs, LoRA's 64), as the recipe pays it."""
    from accelerate import Accelerator

    cfg, not_here = setting.config(kit.device)
    settings = cfg.model
    processor = kit.processor
    renderer = ScorerRenderer(processor, image_policy_for(processor), max_length=cfg.data.max_length)
    data = Rendered(long_rows(rows, renderer, setting.row_tokens) if setting.row_tokens else rows, renderer)
    longest = batch_token_slots([0], [max(data.lengths)], cfg.data.pad_to_multiple_of)
    batch = micro_batch(cfg, longest if setting.row_tokens else None, batch)
    cfg = dataclasses.replace(cfg, per_device_batch_size=batch)  # the accumulation follows, as a run's would
    model = prepare_for_training(build_model(kit, depth), settings)
    model.train()
    plan = CheckpointPlan.for_model(model, settings)
    train_vision = settings.train_vision_tower and not settings.lora.enabled
    flops = FlopsModel.from_model(model, lora=settings.lora.enabled, train_vision=train_vision)
    accumulation = cfg.gradient_accumulation_steps(cfg.world_size or 1)
    accelerator = Accelerator(cpu=kit.device.type == "cpu", mixed_precision=kit.mixed_precision)
    prepared, optimizer = accelerator.prepare(model, build_optimizer(model, cfg))
    trainable = [p for p in prepared.parameters() if p.requires_grad]
    sampler = build_batch_sampler(batching, data.lengths, batch, 1, cfg.seed, 1, cfg.data.group_window)
    loader = torch.utils.data.DataLoader(
        data,
        batch_sampler=sampler,
        collate_fn=ScorerCollator(processor.tokenizer.pad_token_id, cfg.data.pad_to_multiple_of),
        num_workers=workers,  # the 7B configs render in 8 workers (data.num_workers), as the recipe does
    )
    t0 = time.perf_counter()
    window = list(itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader)), steps))
    render_s = (time.perf_counter() - t0) / steps
    if kit.device.type == "cuda":
        window = [{k: v.pin_memory() for k, v in b.items()} for b in window]
    phases = Phases(kit)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    phases.hook(base.model.visual if hasattr(base, "model") else base.visual)
    losses: list[torch.Tensor] = []
    bookkeeping = ThroughputMeter(flops, kit.peak_tflops, 1)  # the recipe's per-micro-batch logging

    def micro_step(cpu_batch: dict) -> None:
        with phases.phase("host→device copy"):
            on_device = {k: v.to(kit.device, non_blocking=True) for k, v in cpu_batch.items()}
        result = train_step(
            accelerator,
            prepared,
            optimizer,
            on_device,
            trainable=trainable,
            max_grad_norm=cfg.optim.max_grad_norm,
            memory=plan,
            phase=phases.phase,
        )
        with phases.phase("logging"):
            losses.append(result.loss.float())
            bookkeeping.add_batch(on_device)
            if result.optimizer_stepped:
                log_totals(losses, bookkeeping, kit.device).cpu()
                losses.clear()

    def run_pass(batches: list[dict]) -> list[float]:
        """The batches as one accumulation (the optimizer steps after the last); per-step seconds."""
        accelerator.gradient_accumulation_steps = len(batches)
        accelerator.step = 0
        marks = []
        for cpu_batch in batches:
            start = phases.clock.mark()
            micro_step(cpu_batch)
            marks.append((start, phases.clock.mark()))
        kit.sync()
        return [phases.clock.seconds(a, b) for a, b in marks]

    if kit.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(kit.device)
    buckets: dict[tuple, dict] = {}
    for b in window:
        buckets.setdefault(shape_key(b), b)
    warm = list(buckets.values())
    warm += [window[i % len(window)] for i in range(max(0, warmup - len(warm)))]
    run_pass(warm)  # kernels, the allocator, compilation, the optimizer's state: every shape once

    work = ThroughputMeter(flops, kit.peak_tflops, 1)  # what one pass computes: the model's FLOPs
    hardware = 0.0  # and what the device runs, recompute included
    for b in window:
        work.add_batch(b)
        lengths, patches, _ = batch_shape_stats(b)
        share = recomputed_share(settings, plan, model, b)
        hardware += flops.with_recompute(share).batch_flops(lengths, patches, labelled_tokens(b))
    samples, tokens, slots, model_flops = work.local_totals().tolist()
    passes = []
    phases.mode = "timed"
    for _ in range(repeats):
        with gc_frozen():
            seconds = run_pass(window)
        optimizer_s = phases.optimizer_seconds()
        micro = (sum(seconds) - optimizer_s) / steps
        passes.append(
            {
                "raw": sum(seconds) / steps,
                "step": micro + optimizer_s / accumulation,
                "optimizer": optimizer_s,
            }
        )
    phases.mode = "profile"
    with gc_frozen():
        t1 = time.perf_counter()
        run_pass(window)
        profiled = time.perf_counter() - t1
    phases.mode = None
    shares = {k: v / profiled for k, v in phases.total.items()}
    shares["language-model forward"] = shares.pop("forward", 0.0) - shares.get("vision forward", 0.0)
    shares["language-model backward"] = shares.pop("backward", 0.0) - shares.get("vision backward", 0.0)
    shares["unaccounted"] = 1.0 - sum(shares.values())
    llm_seconds = (shares["language-model forward"] + shares["language-model backward"]) * profiled
    llm_only = {"vision_factor": 0.0, "merger_factor": 0.0}
    llm_model = llm_hardware = 0.0
    for b in window:
        lengths, patches, _ = batch_shape_stats(b)
        head = labelled_tokens(b)
        llm_model += dataclasses.replace(flops, **llm_only).batch_flops(lengths, patches, head)
        share = recomputed_share(settings, plan, model, b)
        llm_hardware += dataclasses.replace(flops.with_recompute(share), **llm_only).batch_flops(
            lengths, patches, head
        )
    step_s = [p["step"] for p in passes]
    rates = {
        "samples_per_s": [samples / steps / s for s in step_s],
        "step_s": step_s,
        "mfu": [model_flops / steps / s / (kit.peak_tflops * 1e12) for s in step_s],
        "hfu": [hardware / steps / s / (kit.peak_tflops * 1e12) for s in step_s],
    }
    spread = {key: _spread(values) for key, values in rates.items()}
    timed = _spread([p["raw"] for p in passes])["median"]
    ratio = timed / (profiled / steps)
    peak = torch.cuda.max_memory_allocated(kit.device) / 2**30 if kit.device.type == "cuda" else None
    row = {
        "mode": setting.label,
        "overrides": list(setting.overrides) + [f"{o} (CUDA only: off here)" for o in not_here],
        "batching": batching,
        "micro_batch": batch,
        "workers": workers,
        "warmup": len(warm),
        "shape_buckets": len(buckets),
        "steps": steps,
        "repeats": repeats,
        "depth": model_config(kit, depth).get_text_config().num_hidden_layers,
        "row_tokens": sum(data.lengths) / len(data.lengths),
        "max_batch_tokens": max(b["input_ids"].numel() for b in window),
        "memory_plan": describe_plan(settings, sampler, data.lengths, cfg.data.pad_to_multiple_of),
        "recomputed_share": sum(recomputed_share(settings, plan, model, b) for b in window) / steps,
        "accumulation": accumulation,
        "optimizer_s": _spread([p["optimizer"] for p in passes])["median"],
        "samples_per_s": spread["samples_per_s"]["median"],
        "tokens_per_s": tokens / steps / spread["step_s"]["median"],
        "step_s": spread["step_s"]["median"],
        "tflops_per_s": model_flops / steps / spread["step_s"]["median"] / 1e12,
        "mfu": spread["mfu"]["median"],
        "hfu": spread["hfu"]["median"],
        "spread": spread,
        "padding": 1.0 - tokens / slots if slots else 0.0,
        "render_s_per_batch": render_s,
        "peak_mem_gib": peak,
        "phases": shares,
        "timed_step_s": timed,
        "profiled_step_s": profiled / steps,
        "timed_vs_profiled": ratio,
        "timing_agrees": abs(ratio - 1.0) <= TIMING_TOLERANCE,
        # the language model's forward and backward (the tower's backward excluded, recompute included)
        "llm_seconds_per_step": llm_seconds / steps,
        "llm_mfu": llm_model / max(llm_seconds, 1e-9) / (kit.peak_tflops * 1e12),
        "llm_tflops_per_s": llm_hardware / max(llm_seconds, 1e-9) / 1e12,
        "vision_calls_per_step": phases.vision_calls / steps,
    }
    accelerator.free_memory()
    if not row["timing_agrees"]:
        logger.warning("%s: timed step %.2fx the profiled step (more than 5%% apart)", setting.label, ratio)
    return row


def train_fitting(kit: Kit, rows: list[dict], *, setting: TrainSetting, **kwargs) -> dict:
    """:func:`train_bench` at full depth, else at half the decoder layers until it fits (said in the row)."""
    full = model_config(kit).get_text_config().num_hidden_layers
    depth = full
    while True:
        try:
            row = train_bench(kit, rows, setting=setting, depth=depth, **kwargs)
            row["full_depth"] = full
            return row
        except torch.OutOfMemoryError:
            pass
        gc.collect()  # out of the except block: the failed attempt's frames (and tensors) are gone
        if kit.device.type == "cuda":
            torch.cuda.empty_cache()
        if depth <= 2:
            return {
                "mode": setting.label,
                "batching": kwargs["batching"],
                "micro_batch": kwargs["batch"] or "the config's",
                "oom": True,
                "full_depth": full,
            }
        logger.warning(
            "%s at %d of %d layers does not fit: trying %d", setting.label, depth, full, depth // 2
        )
        depth //= 2


# ----------------------------------------------------------------------------- the practical ceiling
def gemm_ceiling(kit: Kit, tokens: int, reps: int = 10) -> dict:
    """bf16 matrix products at the language model's shapes (``tokens`` rows: one micro-batch), forward and
    both backward forms, each timed after a warm-up: the rate the device reaches on this model's own
    products, the practical ceiling for its forward and backward (the data sheet's peak is not)."""
    text = model_config(kit).get_text_config()
    d, ffn = text.hidden_size, text.intermediate_size
    head_dim = getattr(text, "head_dim", None) or d // text.num_attention_heads
    kv = text.num_key_value_heads * head_dim
    shapes = {"q/o projection": (d, d), "k, v projection": (d, kv), "gate, up": (d, ffn), "down": (ffn, d)}
    weight = {"q/o projection": 2, "k, v projection": 2, "gate, up": 2, "down": 1}  # products per layer
    rows, flops_total, seconds_total = [], 0.0, 0.0
    for name, (k, n) in shapes.items():
        x = torch.randn(tokens, k, device=kit.device, dtype=kit.dtype)
        w = torch.randn(k, n, device=kit.device, dtype=kit.dtype)
        dy = torch.randn(tokens, n, device=kit.device, dtype=kit.dtype)
        products = {
            "forward": lambda x=x, w=w: x @ w,
            "input grad": lambda dy=dy, w=w: dy @ w.T,
            "weight grad": lambda x=x, dy=dy: x.T @ dy,
        }
        for form, run in products.items():
            run()
            kit.sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                run()
            kit.sync()
            seconds = (time.perf_counter() - t0) / reps
            flops = 2.0 * tokens * k * n
            rows.append(
                {"shape": name, "form": form, "m_k_n": [tokens, k, n], "tflops_per_s": flops / seconds / 1e12}
            )
            flops_total += weight[name] * flops
            seconds_total += weight[name] * seconds
    return {"tokens": tokens, "rows": rows, "tflops_per_s": flops_total / seconds_total / 1e12}


# ----------------------------------------------------------------------------- the vision tower
def vision_bench(kit: Kit, batch_sizes: list[int], reps: int) -> dict:
    """The vision tower alone at the shape's size: transformers' per-window loop, then keyshot's changes one
    by one (batched windows, the patch embedding, the padded MLPs, the packing from the grid that leaves
    no host sync in the forward; on CUDA the varlen windows, torch.compile per block and CUDA graphs per
    grid), screenshots/s at each batch of 1280×720 screenshots, the share of the peak (the tower's FLOPs:
    its blocks per patch with their attention, the merger once per merged token: ``forward_counts``), and
    how far each output is from transformers'."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from keyshot.infer.model.vision_attention import (
        use_batched_window_attention,
        use_linear_patch_embed,
        use_padded_vision_mlp,
    )
    from keyshot.infer.model.vision_packing import grid_of, use_grid_packing

    torch.manual_seed(0)
    config = model_config(kit).vision_config
    with torch.device(kit.device):
        tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(
            config, dtype=kit.dtype, attn_implementation="sdpa"
        ).eval()
    images = [img.pil() for img in screenshots(max(batch_sizes))]
    inputs = kit.processor.image_processor(images=images, return_tensors="pt")
    pixels = inputs["pixel_values"].to(kit.device, kit.dtype)
    host_grid = inputs["image_grid_thw"]  # the processor's: on the host
    grids = {"in use": host_grid.to(kit.device)}  # transformers' own forward reads a grid on the device
    patches_per_image = int(host_grid[0].prod())

    def run(n: int) -> torch.Tensor:
        rows = int(host_grid[:n].prod(dim=-1).sum())
        return tower(pixels[:rows], grid_thw=grids["in use"][:n])

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
    flops = dataclasses.replace(forward_counts(kit), llm_factor=0.0).batch_flops([0], [patches_per_image], 0)
    result["flops_per_screenshot"] = flops

    def measure(name: str) -> None:
        with torch.inference_mode():
            out = unwrap(run(probe)).float()
        rates = {n: rate(n) for n in batch_sizes}
        result["variants"].append(
            {
                "name": name,
                "max_abs_diff": float((out - reference).abs().max()),
                "rates": rates,
                "mfu": {n: r * flops / (kit.peak_tflops * 1e12) for n, r in rates.items()},
            }
        )

    measure("transformers' per-window loop")
    result["patched_layers"] = use_batched_window_attention(tower)
    measure("batched windows")
    use_linear_patch_embed(tower)
    measure("+ patch embedding as one matrix product")
    use_padded_vision_mlp(tower)
    measure("+ MLP padded to 128, gate and up in one product")
    use_grid_packing(tower)
    grids["in use"] = host_grid  # as the processor made it: the forward then reads nothing back
    measure("+ packing from the grid (no host sync in the forward)")
    # the speed switches of the tower (train/speedups.py: model.vision_attention, model.compile) and its CUDA
    # graphs (vision_graphs.py); CUDA only. A switch that fails is named in the result and the rows above stand.
    if kit.device.type == "cuda":
        from keyshot.infer.model.vision_graphs import use_tower_cuda_graphs
        from keyshot.infer.model.vision_varlen import use_varlen_vision_attention

        def compile_blocks() -> None:
            for block in tower.blocks:
                block.compile()

        def capture() -> None:
            use_tower_cuda_graphs(tower, [grid_of(host_grid[:n]) for n in {*batch_sizes, probe}])

        switches = {
            "+ windows through torch's variable-length attention (model.vision_attention=varlen)": lambda: (
                use_varlen_vision_attention(tower)
            ),
            "+ torch.compile per block (model.compile=inductor)": compile_blocks,
            "+ CUDA graphs per grid (use_tower_cuda_graphs)": capture,
        }
        for name, apply in switches.items():
            try:
                apply()
                measure(name)
            except Exception as exc:  # noqa: BLE001 (reported in the table's notes)
                logger.exception("vision variant %s failed", name)
                result.setdefault("failed", []).append(f"{name}: {type(exc).__name__}: {exc}"[:400])
                break
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


def forward_counts(kit: Kit) -> FlopsModel:
    """Forward-only FLOP counts of the shape (every factor 1), from the model built on the meta device."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(model_config(kit), dtype=kit.dtype)
    counts = FlopsModel.from_model(model, lora=False, train_vision=False)
    return dataclasses.replace(counts, llm_factor=1.0, vision_factor=1.0, merger_factor=1.0)


def forward_flops(kit: Kit, seq_len: int, patches: int) -> float:
    """Forward FLOPs of one scorer request: the LM head on the one position it keeps (``logits_to_keep=1``)."""
    return forward_counts(kit).batch_flops([seq_len], [patches], head_tokens=1)


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


# ----------------------------------------------------------------------------- report
#: The targets (issue 56; the scorer's of issue 47), as ratios on one GPU.
TARGETS = {
    "lora_step_vs_full": 0.85,
    "lora_mfu_checkpointed": 0.30,
    "lora_mfu_unchecked": 0.42,
    "llm_of_gemm": 0.65,
    "tower_batch1": 35.0,
    "scorer_batch1": 0.40,
    "scorer_batch8": 0.50,
}


def _measured(train_rows: list[dict]) -> list[dict]:
    return [r for r in train_rows if not r.get("oom")]


def _best(rows: list[dict], key: str) -> dict | None:
    return max(rows, key=lambda r: r[key]) if rows else None


def targets(
    train_rows: list[dict], scoring: dict | None, vision: dict | None, gemm: dict | None
) -> list[tuple]:
    """(target, measured, met) for each target that this run measured. LoRA counts 4N per token (its
    language model's forward and input gradients); "checkpointed" rows recompute every decoder layer for
    every micro-batch, "without checkpointing" rows none."""
    out = []
    rows = _measured(train_rows)
    lora = [r for r in rows if r["mode"].startswith("lora")]
    checked = [r for r in lora if r["recomputed_share"] >= 1.0]
    unchecked = [r for r in lora if r["recomputed_share"] == 0.0]
    full = next((r for r in rows if r["mode"] == "full"), None)
    if (best := _best(checked, "mfu")) is not None:
        out.append(
            (
                f"LoRA checkpointed ≥ 30 % MFU ({best['mode']})",
                f"{100 * best['mfu']:.1f} %",
                best["mfu"] >= TARGETS["lora_mfu_checkpointed"],
            )
        )
        if full is not None:
            ratio = best["step_s"] / full["step_s"]
            out.append(
                (
                    f"LoRA checkpointed step ≤ 0.85x the full fine-tune's, optimizers amortised as the recipe's ({best['mode']})",
                    f"{ratio:.2f}x",
                    ratio <= TARGETS["lora_step_vs_full"],
                )
            )
    if (best := _best(unchecked, "mfu")) is not None:
        out.append(
            (
                f"LoRA without checkpointing ≥ 42 % MFU ({best['mode']})",
                f"{100 * best['mfu']:.1f} %",
                best["mfu"] >= TARGETS["lora_mfu_unchecked"],
            )
        )
    if gemm:
        for r in lora:
            share = r["llm_tflops_per_s"] / gemm["tflops_per_s"]
            out.append(
                (
                    f"LoRA: the language model's forward and backward ≥ 65 % of the GEMM rate ({r['mode']})",
                    f"{100 * share:.1f} %",
                    share >= TARGETS["llm_of_gemm"],
                )
            )
    if vision and any(1 in v["rates"] for v in vision.get("variants", [])):
        best = max(vision["variants"], key=lambda v: v["rates"].get(1, 0.0))
        out.append(
            (
                f"vision tower ≥ 35 screenshots/s at batch 1 ({best['name']})",
                f"{best['rates'][1]:.1f}/s",
                best["rates"][1] >= TARGETS["tower_batch1"],
            )
        )
    for r in rows:
        out.append(
            (
                f"timed step within 5 % of the profiled step ({r['mode']})",
                f"{r['timed_vs_profiled']:.3f}x",
                r["timing_agrees"],
            )
        )
    if scoring:
        for r in scoring["rows"]:
            goal = TARGETS["scorer_batch1"] if r["batch"] < 8 else TARGETS["scorer_batch8"]
            same = [v for v in scoring.get("variants", []) if v["batch"] == r["batch"]]
            best = max([r, *same], key=lambda v: v["ceiling_fraction"])
            out.append(
                (
                    f"in-process scorer ≥ {100 * goal:.0f} % of its ceiling at batch {r['batch']} ({best['variant']}; issue 47)",
                    f"{100 * best['ceiling_fraction']:.1f} %",
                    best["ceiling_fraction"] >= goal,
                )
            )
    return out


def _cell(spread: dict, scale: float = 1.0, fmt: str = ".2f") -> str:
    return f"{spread['median'] * scale:{fmt}} ({spread['min'] * scale:{fmt}}–{spread['max'] * scale:{fmt}})"


def markdown(
    kit: Kit,
    info: dict,
    train_rows: list[dict],
    scoring: dict | None,
    command: str,
    vision: dict | None = None,
    errors: dict[str, str] | None = None,
    gemm: dict | None = None,
) -> str:
    lines = [
        "# keyshot GPU benchmark kit (bench/gpu.py)",
        "",
        f"Device: **{info['device']}**; peak {kit.peak_tflops:g} TFLOP/s ({kit.peak_source}); shape `{kit.shape}`, "
        f"dtype {str(kit.dtype).removeprefix('torch.')}. Command: `{command}`. {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
        + f". Commit {info['commit']}.",
        "",
    ]
    met = targets(train_rows, scoring, vision, gemm)
    if met:
        lines += ["## Targets", "", "| target | measured | met |", "|---|---:|---|"]
        lines += [f"| {name} | {value} | {'yes' if ok else '**no**'} |" for name, value, ok in met]
        lines.append("")
    if gemm:
        lines += [
            "## The practical ceiling: bf16 products at the language model's shapes",
            "",
            f"{gemm['tokens']:,} rows (one micro-batch's tokens); weighted by a decoder layer's products: "
            f"**{gemm['tflops_per_s']:.3g} TFLOP/s** ({100 * gemm['tflops_per_s'] / kit.peak_tflops:.0f} % of the data sheet's peak).",
            "",
            "| product | form | m, k, n | TFLOP/s |",
            "|---|---|---|---:|",
        ]
        lines += [
            f"| {r['shape']} | {r['form']} | {', '.join(f'{x:,}' for x in r['m_k_n'])} | {r['tflops_per_s']:.3g} |"
            for r in gemm["rows"]
        ]
        lines.append("")
    lines += [
        "## Training (the recipe's step: keyshot.train.step.train_step and build_optimizer under accelerate)",
        "",
        "Each row: the shipped 7B config of its mode with the overrides it names, one window of micro-batches "
        "drawn once from the recipe's sampler; a warm-up until every shape bucket of the window ran, then timed "
        "passes over the window (per-step CUDA events, no synchronise, garbage collection off) and one profiled "
        "pass over the same batches. Step s amortises the optimizer step over the recipe's accumulation (one "
        "rank of its global batch), as the recipe pays it. Medians of the timed passes, their range in "
        "brackets. MFU counts the model's FLOPs (`keyshot.train.throughput.FlopsModel`, LoRA at 4N); HFU adds "
        "what checkpointing recomputes. Timed/profiled: the timed pass's mean step over the profiled one's "
        "(5 % apart at most).",
        "",
        "| mode | overrides | tokens/row | micro-batch | depth | samples/s | step s | TFLOP/s | MFU | HFU | timed/profiled | peak GiB |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in train_rows:
        if r.get("oom"):
            lines.append(f"| {r['mode']} | | | {r['micro_batch']} | does not fit | | | | | | | |")
            continue
        depth = f"{r['depth']}/{r['full_depth']}" + (
            " (reduced: full depth does not fit)" if r["depth"] < r["full_depth"] else ""
        )
        mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "n/a"
        sp = r["spread"]
        timing = f"{r['timed_vs_profiled']:.3f}" + (
            "" if r["timing_agrees"] else " (**more than 5 % apart**)"
        )
        lines.append(
            f"| {r['mode']} | {', '.join(f'`{o}`' for o in r['overrides']) or '—'} | {r['row_tokens']:,.0f} "
            f"| {r['micro_batch']} | {depth} | {_cell(sp['samples_per_s'])} | {_cell(sp['step_s'], fmt='.3f')} "
            f"| {r['tflops_per_s']:.3g} | {_cell(sp['mfu'], 100, '.1f')} % | {_cell(sp['hfu'], 100, '.1f')} % "
            f"| {timing} | {mem} |"
        )
    lines += ["", "Checkpointing and the optimizer, per row:", ""]
    for r in train_rows:
        if not r.get("oom"):
            lines.append(
                f"- {r['mode']}: {r['memory_plan']}; the window's largest micro-batch {r['max_batch_tokens']:,} "
                f"token slots; the optimizer step {r['optimizer_s']:.3f} s once per {r['accumulation']} micro-batches; "
                f"{r['shape_buckets']} shape bucket(s) in {r['warmup']} warm-up step(s); rendering "
                f"{r['render_s_per_batch']:.3f} s a batch in {r['workers']} DataLoader workers"
            )
    lines += [
        "",
        "### Where a training step's time goes (the profiled pass, each phase closed by a synchronise)",
        "",
        "The vision backward runs from the gradient's arrival at the tower's output to the backward's end "
        "(the merger's, and the tower's where it trains); the language model's phases exclude both tower phases; "
        "the optimizer's share is of the profiled pass (one step in it).",
        "",
    ]
    names = [
        "host→device copy",
        "vision forward",
        "language-model forward",
        "language-model backward",
        "vision backward",
        "optimizer",
        "logging",
        "unaccounted",
    ]
    lines.append(
        "| mode | "
        + " | ".join(names)
        + " | profiled step s | vision forwards/step | LM fwd+bwd MFU | LM fwd+bwd TFLOP/s (recompute included) |"
    )
    lines.append("|---|" + "---:|" * (len(names) + 4))
    for r in train_rows:
        if r.get("oom"):
            continue
        cells = " | ".join(f"{100 * r['phases'].get(n, 0.0):.1f}%" for n in names)
        lines.append(
            f"| {r['mode']} | {cells} | {r['profiled_step_s']:.3f} | {r['vision_calls_per_step']:.1f} "
            f"| {100 * r['llm_mfu']:.1f}% | {r['llm_tflops_per_s']:.3g} |"
        )
    if scoring:
        lines += [
            "",
            "## Scoring (in-process TransformersScorer, prefill, 1280×720, the real scorer prompt)",
            "",
            f"One request: {scoring['request_tokens']:,} tokens ({scoring['visual_tokens']:,} visual), "
            f"{scoring['flops_per_screenshot'] / 1e12:.2f} TFLOP forward (the LM head on the one position kept); "
            f"compute ceiling {scoring['ceiling_screenshots_per_s']:.1f} screenshots/s at the data sheet's peak.",
            "",
            "| back-end | batch | screenshots/s | of the ceiling | CPU preprocessing s/screenshot |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in scoring["rows"]:
            lines.append(
                f"| transformers | {r['batch']} | {r['screenshots_per_s']:.2f} | {100 * r['ceiling_fraction']:.1f}% | {r['preprocess_s']:.4f} |"
            )
        for r in scoring.get("variants", []):
            lines.append(
                f"| transformers {r['variant']} | {r['batch']} | {r['screenshots_per_s']:.2f} | {100 * r['ceiling_fraction']:.1f}% | {r['preprocess_s']:.4f} |"
            )
        lines.append(f"| vLLM (keyshot serve) | | {scoring['vllm']} | | |")
        lines += [f"- not measured: {note}" for note in scoring.get("failed", [])]
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
            f"{vision['patches_per_image']:,} patches per screenshot, {vision['flops_per_screenshot'] / 1e12:.2f} TFLOP "
            "(blocks with attention, the merger once per merged token); each row adds one change to the row above; "
            f"|difference| is the largest against transformers' output (which reaches {vision['ref_abs_max']:.3g}).",
            "",
            "| variant | |difference| | "
            + " | ".join(f"batch {n}: screenshots/s (MFU)" for n in sizes)
            + " |",
            "|---|---:|" + "---:|" * len(sizes),
        ]
        for v in vision.get("variants", []):
            cells = " | ".join(f"{v['rates'][n]:.2f} ({100 * v['mfu'][n]:.1f}%)" for n in sizes)
            lines.append(f"| {v['name']} | {v['max_abs_diff']:.3g} | {cells} |")
        lines += [f"- not measured: {note}" for note in vision.get("failed", [])]
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
    ap.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="warm-up steps at least (every shape bucket of the window runs once)",
    )
    ap.add_argument("--steps", type=int, default=8, help="micro-batches of the window, timed and profiled")
    ap.add_argument(
        "--repeats", type=int, default=2, help="timed passes over the window (their range is shown)"
    )
    ap.add_argument("--rows", type=int, default=64, help="training examples rendered")
    ap.add_argument(
        "--batch",
        type=int,
        help="micro-batch (default: the config's per_device_batch_size; @TOKENS rows: the cap's)",
    )
    ap.add_argument(
        "--train",
        default=DEFAULT_TRAIN,
        help="training rows, ';'-separated: lora, full, or LABEL=MODE[@TOKENS]:key=value,key=value (overrides of "
        "the shipped config's model: section; @TOKENS: rows of that many tokens, as many as the token cap holds "
        "in a micro-batch); '' to skip",
    )
    ap.add_argument("--batchings", default="length_grouped")
    ap.add_argument("--score-batches", default="1,8")
    ap.add_argument("--score-reps", type=int, default=3)
    ap.add_argument("--gemm", action=argparse.BooleanOptionalAction, default=True, help="the GEMM ceiling")
    ap.add_argument("--peak", type=float, help="device peak TFLOP/s (default: from the device name)")
    ap.add_argument(
        "--cpu-peak", type=float, default=0.2, help="nominal CPU TFLOP/s for the tiny shape's MFU"
    )
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--vision-batches", default="1,8", help="vision tower alone ('' to skip)")
    ap.add_argument(
        "--workers", type=int, help="DataLoader workers (default: 8 on CUDA as the 7B configs, else 0)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS-gpu.md")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = [TrainSetting.parse(t.strip()) for t in args.train.split(";") if t.strip()]

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = args.shape or ("7b" if device.type == "cuda" else "tiny")
    peak, source = (args.peak, "--peak") if args.peak else device_peak(device, args.cpu_peak)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    workers = args.workers if args.workers is not None else (8 if device.type == "cuda" else 0)
    command = "python -m bench.gpu " + " ".join(argv if argv is not None else sys.argv[1:])
    train_rows: list[dict] = []
    scoring: dict | None = None
    vision: dict | None = None
    gemm: dict | None = None
    errors: dict[str, str] = {}

    def save() -> None:
        """Written after every section: a run cut short by its time limit keeps what it measured."""
        text = markdown(kit, info, train_rows, scoring, command.strip(), vision, errors, gemm)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, text)
        if args.json:
            data = {
                "info": info,
                "targets": [list(t) for t in targets(train_rows, scoring, vision, gemm)],
                "gemm": gemm,
                "training": train_rows,
                "scoring": scoring,
                "vision": vision,
                "errors": errors,
            }
            write_text_atomic(args.json, json.dumps(data, indent=2, default=str))

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
            "commit": commit(),
            "workers": workers,
        }
        rows = list(scorer_rows(args.rows, seed=0, agent="bench", sizes=SIZES))
        if args.gemm:
            logger.info("GEMM ceiling")
            renderer = ScorerRenderer(processor, image_policy_for(processor), max_length=4096)
            lengths = sorted(Rendered(rows, renderer).lengths)
            tokens = (args.batch or 4) * lengths[len(lengths) // 2]  # one micro-batch of the 7B configs
            gemm = section("GEMM ceiling", lambda: gemm_ceiling(kit, tokens))
        if args.vision_batches:
            logger.info("vision tower")
            vision_sizes = [int(b) for b in args.vision_batches.split(",")]
            vision = section("vision tower", lambda: vision_bench(kit, vision_sizes, args.score_reps))
        for setting in settings:
            for batching in args.batchings.split(","):
                logger.info("training: %s, %s", setting.label, batching)
                row = section(
                    f"training {setting.label} {batching}",
                    lambda setting=setting, batching=batching: train_fitting(
                        kit,
                        rows,
                        setting=setting,
                        batching=batching,
                        batch=args.batch,
                        steps=args.steps,
                        warmup=args.warmup,
                        repeats=args.repeats,
                        workers=workers,
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
