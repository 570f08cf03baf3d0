"""Loading the Qwen2.5-VL scorer for training: attention kernel, freezing, LoRA, parameter groups."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

import torch

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.model.vision_attention import use_fast_vision_tower
from keyshot.train.train_config import ModelSettings, OptimSettings

logger = logging.getLogger(__name__)

VISION_PREFIX = "visual."  # model.visual.* (blocks, patch_embed) and model.visual.merger.*
MERGER_PREFIX = "visual.merger."
NO_DECAY_MARKERS = ("bias", "norm", "ln_q")


class ModelSetupError(KeyshotError, RuntimeError):
    """The model cannot be set up as the config asks."""


def attention_implementation(requested: str = "auto") -> str:
    """flash_attention_2 when flash-attn is installed and a GPU is present, else PyTorch SDPA."""
    if requested != "auto":
        if requested == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
            raise ModelSetupError(
                "model.attn_implementation=flash_attention_2 but flash-attn is not installed"
            )
        return requested
    if torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def _section(name: str) -> str:
    """'vision', 'merger' or 'llm' for a parameter name of Qwen2.5-VL (peft prefixes allowed)."""
    if MERGER_PREFIX in name:
        return "merger"
    if VISION_PREFIX in name:
        return "vision"
    return "llm"


def load_scorer_model(settings: ModelSettings):
    """Load the base model with the chosen attention kernel and dtype, freeze, add LoRA, checkpoint."""
    from transformers import AutoModelForImageTextToText

    attn = attention_implementation(settings.attn_implementation)
    logger.info("loading %s (dtype=%s, attention=%s)", settings.name_or_path, settings.dtype, attn)
    model = AutoModelForImageTextToText.from_pretrained(
        settings.name_or_path, dtype=getattr(torch, settings.dtype), attn_implementation=attn
    )
    return prepare_for_training(model, settings)


def prepare_for_training(model, settings: ModelSettings):
    """Set a loaded (or freshly built: bench/gpu.py) Qwen2.5-VL up as the recipe trains it: no KV cache,
    batched vision windows, frozen vision tower, activation checkpointing, LoRA."""
    model.config.get_text_config().use_cache = False  # no KV cache while training (checkpointing)
    use_fast_vision_tower(model)  # batched windows, matrix-product patch embedding, padded frozen MLPs
    freeze(model, settings)
    if settings.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if settings.lora.enabled:
        # No enable_input_require_grads(): non-reentrant checkpointing needs no input that asks for a
        # gradient, and transformers' hook also marks the vision tower's patch embedding, so the frozen
        # tower was recorded, recomputed and back-propagated through (bench/RESULTS-gpu.md).
        model = add_lora(model, settings)
    from keyshot.train.speedups import apply_speedups  # imported here: speedups imports this module

    apply_speedups(model, settings)  # the speed switches: liger_kernel, compile, vision_attention, ...
    log_trainable(model)
    return model


def freeze(model, settings: ModelSettings) -> None:
    """Vision tower frozen unless ``train_vision_tower``; merger and LLM trainable (full fine-tune)."""
    for name, param in model.named_parameters():
        param.requires_grad = _section(name) != "vision" or settings.train_vision_tower


def add_lora(model, settings: ModelSettings):
    """Wrap the model with peft LoRA on ``settings.lora.target_modules`` (language model only by default)."""
    from peft import LoraConfig, get_peft_model

    lora = settings.lora
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)
    keep_input_dtype_under_autocast(model)
    adapted = [n for n, _ in model.named_modules() if n.endswith("lora_A")]
    if not adapted:
        raise ModelSetupError(
            f"model.lora.target_modules {lora.target_modules!r} matches no module of the model"
        )
    in_vision = sum(_section(n) != "llm" for n in adapted)
    logger.info("LoRA r=%d on %d modules (%d in the vision tower/merger)", lora.r, len(adapted), in_vision)
    return model


def keep_input_dtype_under_autocast(model) -> int:
    """Let LoRA layers keep their input's dtype while autocast runs (the recipe's mixed precision).

    peft keeps the adapters in float32 and casts each layer's input to float32 before dropout and the
    adapter products; under autocast those products run in bfloat16 anyway, so the cast only moves
    memory: a float32 copy of every adapted activation, dropped out in float32. On an H200 at the 7B shape
    that made a LoRA step 1.6x slower than with bfloat16 activations (bench/RESULTS-gpu.md). The adapters
    stay float32 (the optimizer's precision); outside autocast peft's cast is kept."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    patched = 0
    for module in model.modules():
        if not (isinstance(module, BaseTunerLayer) and hasattr(module, "_cast_input_dtype")):
            continue

        def cast(x, dtype, _peft_cast=module._cast_input_dtype):
            if x is not None and torch.is_autocast_enabled(x.device.type):
                return x
            return _peft_cast(x, dtype)

        module._cast_input_dtype = cast
        patched += 1
    return patched


@dataclass(frozen=True)
class ParamCounts:
    total: int
    trainable: int
    vision: int
    merger: int
    llm: int
    llm_embeddings: int


def count_parameters(model) -> ParamCounts:
    counts = {"vision": 0, "merger": 0, "llm": 0}
    total = trainable = embed = 0
    for name, p in model.named_parameters():
        if "lora_" in name:
            trainable += p.numel() if p.requires_grad else 0
            continue
        n = p.ds_numel if hasattr(p, "ds_numel") else p.numel()
        total += n
        trainable += n if p.requires_grad else 0
        counts[_section(name)] += n
        if "embed_tokens" in name:
            embed += n
    return ParamCounts(total, trainable, counts["vision"], counts["merger"], counts["llm"], embed)


def log_trainable(model) -> None:
    c = count_parameters(model)
    logger.info(
        "parameters: %s total, %s trainable (vision %s, merger %s, language model %s)",
        f"{c.total:,}",
        f"{c.trainable:,}",
        f"{c.vision:,}",
        f"{c.merger:,}",
        f"{c.llm:,}",
    )


def parameter_groups(model, optim: OptimSettings, vision_lr_scale: float) -> list[dict]:
    """AdamW groups: decay / no-decay (biases, norms) × vision tower (lower lr) / the rest."""
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        vision = _section(name) == "vision"
        shape = getattr(p, "ds_shape", p.shape)  # ZeRO-3 partitions hold a flat shard
        no_decay = len(shape) < 2 or any(m in name for m in NO_DECAY_MARKERS)
        groups.setdefault((vision, no_decay), []).append(p)
    if not groups:
        raise ModelSetupError("no trainable parameter: check model.lora / model.train_vision_tower")
    out = []
    for (vision, no_decay), params in sorted(groups.items()):
        out.append(
            {
                "params": params,
                "lr": optim.lr * (vision_lr_scale if vision else 1.0),
                "weight_decay": 0.0 if no_decay else optim.weight_decay,
                "name": f"{'vision' if vision else 'main'}{'_no_decay' if no_decay else ''}",
            }
        )
    return out
