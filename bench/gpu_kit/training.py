"""The kit's training rows: the recipe's own train_step on the rows a shipped 7B config renders, timed
(CUDA events, no synchronise) and profiled by phase, with MFU and HFU."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import logging
import time

import torch

from bench.gpu_kit.kit import Kit, build_model, model_config
from bench.record import REPO
from keyshot.infer.common.config import load_config
from keyshot.infer.protocol.chat_template import ScorerRenderer, image_policy_for, image_size
from keyshot.infer.protocol.messages import scorer_example
from keyshot.infer.protocol.prompts import load_prompt_set
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


#: A key point of the long rows (``LABEL=MODE@TOKENS``): rows planned at a token cap's length.
KEY_POINT_FILLER = "The page shows the chosen item with its price, its options and the button to buy it"


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
