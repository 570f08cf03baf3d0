"""Loading the Qwen2.5-VL scorer for training: attention kernel, freezing, LoRA, parameter groups."""

from __future__ import annotations

import importlib.util
import logging
import types
from dataclasses import dataclass

import torch

from keyshot.infer.model.vision_attention import use_fast_vision_tower
from keyshot.train.speedups import apply_speedups
from keyshot.train.train_config import ModelSettings, ModelSetupError, OptimSettings

logger = logging.getLogger(__name__)

VISION_PREFIX = "visual."  # model.visual.* (blocks, patch_embed) and model.visual.merger.*
MERGER_PREFIX = "visual.merger."
NO_DECAY_MARKERS = ("bias", "norm", "ln_q")


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
    batched vision windows, frozen vision tower, activation checkpointing, LoRA; no gradient path into a
    frozen tower (:func:`keep_frozen_tower_out_of_backward`)."""
    model.config.get_text_config().use_cache = False  # no KV cache while training (checkpointing)
    use_fast_vision_tower(model)  # batched windows, matrix-product patch embedding, padded frozen MLPs
    freeze(model, settings)
    if settings.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        drop_input_grad_hooks(model)  # transformers hooked every input embedding, the tower's included
    if settings.lora.enabled:
        model = add_lora(model, settings)
    keep_frozen_tower_out_of_backward(model)

    apply_speedups(model, settings)  # the speed switches: liger_kernel, compile, vision_attention, ...
    log_trainable(model)
    return model


#: The forward hooks transformers' ``enable_input_require_grads`` and peft's fallback register on input
#: embeddings: each marks its module's output as asking for a gradient.
INPUT_GRAD_HOOKS = ("make_inputs_require_grads", "make_inputs_require_grad")


def _base(model):
    """The Qwen2.5-VL under a peft wrapper (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _vision_tower(model):
    base = _base(model)
    return getattr(getattr(base, "model", base), "visual", None)


def drop_input_grad_hooks(model) -> int:
    """Remove every input-embedding hook that makes an embedding's output ask for a gradient; returns how many.

    transformers' checkpointing calls ``enable_input_require_grads()`` whenever the model's main input is
    ``input_ids``, and peft's ``PeftModel`` calls it again when checkpointing is on (each call forgets the
    handles of the one before). It hooks every input embedding, the vision tower's ``patch_embed`` included,
    so a frozen tower was recorded and back-propagated through. Checkpointing here is non-reentrant, which
    needs no input that asks for a gradient: the trained weights inside each layer carry the gradient."""
    removed = 0
    for module in _base(model).modules():
        for key, hook in list(module._forward_hooks.items()):
            if getattr(hook, "__name__", "") in INPUT_GRAD_HOOKS:
                del module._forward_hooks[key]
                module._forward_hooks_with_kwargs.pop(key, None)
                module._forward_hooks_always_called.pop(key, None)
                removed += 1
        if isinstance(getattr(module, "_require_grads_hooks", None), list):
            module._require_grads_hooks = []
        module.__dict__.pop("_require_grads_hook", None)
    return removed


def keep_frozen_tower_out_of_backward(model) -> bool:
    """No gradient path into a frozen vision tower; returns whether the tower is frozen.

    Removes the input-gradient hooks (:func:`drop_input_grad_hooks`) and, when no tower weight asks for a
    gradient, turns checkpointing off in its blocks (they record nothing, so there is nothing to recompute).
    A forward hook still left on the frozen tower's patch embedding is said in a warning: a transformers or
    peft upgrade that renamed its input-gradient hook would bring the tower's backward back."""
    drop_input_grad_hooks(model)
    visual = _vision_tower(model)
    if visual is None:
        logger.warning("no vision tower (model.visual) found: the frozen-tower checks did not apply")
        return False
    merger = getattr(visual, "merger", None)
    merger_ids = {id(p) for p in merger.parameters()} if merger is not None else set()
    frozen = not any(p.requires_grad for p in visual.parameters() if id(p) not in merger_ids)
    if not frozen:
        return False
    for block in getattr(visual, "blocks", []):
        if getattr(block, "gradient_checkpointing", False):
            block.gradient_checkpointing = False
    embed = getattr(visual, "patch_embed", None)
    left = [getattr(h, "__name__", repr(h)) for h in getattr(embed, "_forward_hooks", {}).values()]
    if left:
        logger.warning(
            "the frozen vision tower's patch_embed still has forward hooks %s: if one asks for a gradient, "
            "the tower is back-propagated through (see keyshot.train.scorer_model.drop_input_grad_hooks)",
            left,
        )
    return True


def freeze(model, settings: ModelSettings) -> None:
    """Vision tower frozen unless ``train_vision_tower``; merger and LLM trainable (full fine-tune)."""
    for name, param in model.named_parameters():
        param.requires_grad = _section(name) != "vision" or settings.train_vision_tower


def add_lora(model, settings: ModelSettings):
    """Wrap the model with peft LoRA on ``settings.lora.target_modules`` (language model only by default)."""
    from peft import LoraConfig, get_peft_model

    lora = settings.lora
    if settings.train_vision_tower:
        raise ModelSetupError(
            "model.train_vision_tower=true with model.lora.enabled=true: LoRA freezes every weight outside its "
            "adapters, so the tower would not train; train it with a full fine-tune (model.lora.enabled=false)"
        )
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, config)
    drop_input_grad_hooks(model)  # peft hooked the input embeddings again (checkpointing is on)
    if lora.keep_input_dtype:
        keep_input_dtype_under_autocast(model)
    adapted = [n for n, _ in model.named_modules() if n.endswith("lora_A")]
    if not adapted:
        raise ModelSetupError(
            f"model.lora.target_modules {lora.target_modules!r} matches no module of the model"
        )
    if lora.fused:
        from keyshot.train.lora_fused import use_fused_lora

        use_fused_lora(model)
    in_vision = sum(_section(n) != "llm" for n in adapted)
    logger.info("LoRA r=%d on %d modules (%d in the vision tower/merger)", lora.r, len(adapted), in_vision)
    return model


def _keep_input_dtype(module, x, dtype):
    if x is not None and torch.is_autocast_enabled(x.device.type):
        return x
    return type(module)._cast_input_dtype(module, x, dtype)


def keep_input_dtype_under_autocast(model) -> int:
    """Let LoRA layers keep their input's dtype while autocast runs (the recipe's mixed precision); returns how
    many layers run so (those already patched included: calling it again changes nothing).

    peft keeps the adapters in float32 and casts each layer's input to float32 before dropout and the
    adapter products; under autocast those products run in bfloat16 anyway, so the cast only moves
    memory: a float32 copy of every adapted activation (dropped out in float32 where lora.dropout > 0).
    The adapters stay float32 (the optimizer's precision); outside autocast peft's cast is kept. It replaces
    peft's private ``_cast_input_dtype(x, dtype)`` per layer: where a peft upgrade renamed it, a warning
    says that nothing was patched."""
    import inspect

    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    original = getattr(BaseTunerLayer, "_cast_input_dtype", None)
    expected = ["self", "x", "dtype"]
    if original is None or list(inspect.signature(original).parameters) != expected:
        if layers:
            logger.warning(
                "peft's BaseTunerLayer._cast_input_dtype(self, x, dtype) is gone or changed in this peft: LoRA "
                "layers cast their input to the adapters' float32 under autocast (slower; nothing patched)"
            )
        return 0
    patched = 0
    for module in layers:
        current = module.__dict__.get("_cast_input_dtype")
        if current is None:
            module._cast_input_dtype = types.MethodType(_keep_input_dtype, module)
        elif getattr(current, "__func__", None) is not _keep_input_dtype:
            logger.warning(
                "%s: _cast_input_dtype already replaced by someone else; left as it is", type(module)
            )
            continue
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
