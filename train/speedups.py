"""The speed switches of ``model.*`` (docs/training.md, "Speed switches"): one place that applies them.

:func:`apply_speedups` is called by :func:`keyshot.train.scorer_model.prepare_for_training` after freezing,
checkpointing and LoRA, and can be called by bench/gpu.py on a model it built. Each switch is off by default,
gives transformers' output within the dtype's rounding when on (tests/train/test_speedups.py), and refuses in one
line where it cannot run:

- ``liger_kernel``: Liger-Kernel's Triton RMSNorm (every norm of the language model), SwiGLU (its MLPs)
  and rotary embedding (its attention), patched on this model's modules: the language model only, so the
  vision tower keeps transformers' modules and can be compiled beside it (``compile`` with ``liger_kernel``
  compiles the tower's blocks and leaves the decoder layers to Liger). Liger's own ``apply_liger_kernel_to_qwen2_5_vl`` is not used: its rotary
  patch replaces ``apply_multimodal_rotary_pos_emb``, which transformers 5 no longer calls (it would apply
  nothing, silently), its norm and MLP patches also swap the classes of every model built later in the
  process, and its fused linear cross-entropy replaces the model's forward with one that runs ``lm_head``'s
  chunks over every position, where the recipe computes logits at labelled positions only.
- ``compile``: ``torch.compile`` of each decoder layer and each vision block (regional compilation: every
  layer has the same code, so one compilation serves all of them; the model's own Python stays eager); with
  ``liger_kernel`` the vision blocks only (torch.compile does not trace Liger's Triton kernels).
- ``vision_attention=varlen``: the tower's windows through torch's variable-length attention
  (:mod:`keyshot.infer.model.vision_varlen`) instead of the batched gathers.
- ``padding_free``: right-padded batches run without their padding mask (see :func:`drop_right_padding_mask`).
- ``checkpoint_every``: with ``gradient_checkpointing``, only every N-th decoder layer is checkpointed; the
  others keep their activations (faster, more memory).
"""

from __future__ import annotations

import importlib.util
import logging
import types

import torch

from keyshot.train.train_config import ModelSettings, ModelSetupError

logger = logging.getLogger(__name__)


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Qwen2.5-VL under a peft wrapper (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def _parts(model: torch.nn.Module):
    """(language model, vision tower) of a Qwen2.5-VL for conditional generation; one line if it is none."""
    inner = getattr(base_model(model), "model", None)
    text, visual = getattr(inner, "language_model", None), getattr(inner, "visual", None)
    if text is None or visual is None or not hasattr(text, "layers") or not hasattr(visual, "blocks"):
        raise ModelSetupError(
            f"the speed switches apply to a Qwen2.5-VL (model.language_model.layers, model.visual.blocks); "
            f"{type(base_model(model)).__name__} has no such layers"
        )
    return text, visual


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The language model's decoder layers of a Qwen2.5-VL (peft-wrapped or not)."""
    text, _ = _parts(model)
    return text.layers


def apply_speedups(model: torch.nn.Module, settings: ModelSettings) -> list[str]:
    """Apply every switch ``settings`` turns on to ``model`` (peft-wrapped or not); returns what was applied,
    e.g. ``["liger_kernel: 13 norms, 2 MLPs, rotary", "compile(inductor): 2 layers, 2 blocks"]``.
    Raises :class:`ModelSetupError` (one line) where a switch cannot run here."""
    applied: list[str] = []
    if settings.checkpoint_every > 1 and settings.gradient_checkpointing:
        applied.append(
            f"checkpoint_every={settings.checkpoint_every}: {checkpoint_every(model, settings.checkpoint_every)}"
        )
    if settings.vision_attention == "varlen":
        applied.append(f"vision_attention=varlen: {use_varlen(model)} layers")
    if settings.liger_kernel:
        applied.append(f"liger_kernel: {use_liger_kernel(model)}")
    if settings.padding_free:
        drop_right_padding_mask(model)
        applied.append("padding_free: right-padded batches run without their mask")
    if settings.compile != "off":  # last: the compiled layers trace the patched forwards above
        # Liger's Triton kernels do not trace (torch 2.11, liger-kernel 0.8.5): its decoder layers stay eager
        compiled = compile_layers(model, settings.compile, decoder=not settings.liger_kernel)
        applied.append(f"compile({settings.compile}): {compiled}")
    for line in applied:
        logger.info("speed switch %s", line)
    return applied


# ----------------------------------------------------------------------------------------- checkpointing
def checkpointed_layers(count: int, every: int) -> list[bool]:
    """Which of ``count`` decoder layers are checkpointed with ``model.checkpoint_every=every``: 0, N, 2N, ..."""
    return [index % every == 0 for index in range(count)]


def checkpoint_every(model: torch.nn.Module, every: int) -> str:
    """Keep activation checkpointing on every ``every``-th decoder layer (0, N, 2N, ...) and turn it off on
    the others. The model's checkpointing must be on already."""
    text, _ = _parts(model)
    layers = list(text.layers)
    if not any(getattr(layer, "gradient_checkpointing", False) for layer in layers):
        raise ModelSetupError("model.checkpoint_every needs model.gradient_checkpointing=true")
    for layer, flag in zip(layers, checkpointed_layers(len(layers), every), strict=True):
        layer.gradient_checkpointing = flag
    kept = sum(layer.gradient_checkpointing for layer in layers)
    return f"{kept} of {len(layers)} decoder layers checkpointed"


# ----------------------------------------------------------------------------------------- varlen
def use_varlen(model: torch.nn.Module) -> int:
    from keyshot.infer.model.vision_varlen import VarlenUnavailable, use_varlen_vision_attention

    if not torch.cuda.is_available():
        raise ModelSetupError(
            "model.vision_attention=varlen needs a CUDA GPU (torch's varlen_attn has no CPU kernel): "
            "use vision_attention=batched"
        )
    try:
        return use_varlen_vision_attention(model)
    except VarlenUnavailable as exc:
        raise ModelSetupError(str(exc)) from None


# ----------------------------------------------------------------------------------------- Liger-Kernel
LIGER_MISSING = "model.liger_kernel=true needs liger-kernel with triton and a CUDA GPU (pip install 'keyshot[liger]'); {why}"


def _liger_modules():
    """Liger's RMSNorm, SwiGLU and rotary (imported here: liger imports triton, which needs CUDA)."""
    if not torch.cuda.is_available():
        raise ModelSetupError(LIGER_MISSING.format(why="no CUDA device here"))
    for name in ("liger_kernel", "triton"):
        if importlib.util.find_spec(name) is None:
            raise ModelSetupError(LIGER_MISSING.format(why=f"{name} is not installed"))
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
        from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    except ImportError as exc:  # a liger release without these names
        raise ModelSetupError(LIGER_MISSING.format(why=f"import failed: {exc}")) from None
    return LigerRMSNorm, LigerSwiGLUMLP, liger_rotary_pos_emb


def liger_targets(model: torch.nn.Module) -> tuple[list[torch.nn.Module], list[torch.nn.Module]]:
    """(norms, MLPs) that ``liger_kernel`` patches: the language model's RMSNorms (each layer's two and the
    final one) and its decoder layers' MLPs; nothing of the vision tower or the merger. No norm where this
    transformers has no ``Qwen2_5_VLRMSNorm`` (:func:`use_liger_kernel` then refuses in one line)."""
    from keyshot.infer.model.patch_rules import qwen25_vl_class

    norm_cls = qwen25_vl_class("Qwen2_5_VLRMSNorm")
    text, _ = _parts(model)
    norms = [m for m in text.modules() if norm_cls is not None and isinstance(m, norm_cls)]
    return norms, [layer.mlp for layer in text.layers]


def use_liger_kernel(model: torch.nn.Module) -> str:
    """Liger's RMSNorm on the language model's RMSNorms, its SwiGLU on the language model's MLPs and its
    rotary kernel in the language model's attention (CUDA tensors only): :func:`liger_targets`."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    rms_norm_cls, swiglu_cls, liger_rope = _liger_modules()
    norms, mlps = liger_targets(model)
    for module in norms:
        # LigerRMSNorm's forward reads these attributes; Qwen's norm is Llama's (float32 inside, no offset)
        module.offset, module.casting_mode, module.in_place, module.row_mode = 0.0, "llama", True, None
        module.forward = types.MethodType(rms_norm_cls.forward, module)
    for mlp in mlps:
        if mlp.act_fn.__class__.__name__ not in ("SiLU", "SiLUActivation"):
            raise ModelSetupError(f"model.liger_kernel: Liger's SwiGLU needs silu, got {mlp.act_fn}")
        mlp.forward = types.MethodType(swiglu_cls.forward, mlp)
    norms, mlps = len(norms), len(mlps)
    rope = _patch_rotary(qwen, liger_rope)
    if not norms or not mlps or not rope:
        raise ModelSetupError(
            f"model.liger_kernel applied to {norms} norms, {mlps} MLPs, rotary {rope}: this transformers "
            f"({qwen.__name__}) no longer has the modules it patches; turn the switch off"
        )
    return f"{norms} norms, {mlps} MLPs, rotary"


def _patch_rotary(qwen, liger_rope) -> bool:
    """Route the language model's ``apply_rotary_pos_emb`` (a function of the modeling module) to Liger's
    kernel for CUDA tensors; CPU tensors keep transformers' own. Applying it again changes nothing."""
    original = getattr(qwen.apply_rotary_pos_emb, "_keyshot_original", None) or getattr(
        qwen, "apply_rotary_pos_emb", None
    )
    if original is None:
        return False

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if q.is_cuda:
            return liger_rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    apply_rotary_pos_emb._keyshot_original = original
    qwen.apply_rotary_pos_emb = apply_rotary_pos_emb
    return True


# ----------------------------------------------------------------------------------------- padding-free
def is_right_padded(mask: torch.Tensor) -> bool:
    """Whether every row of a 0/1 mask is ones followed by zeros (one device sync)."""
    return bool(torch.equal(mask, mask.cummin(dim=-1).values))


def _drop_mask(module, args, kwargs):
    mask = kwargs.get("attention_mask")
    if mask is not None and mask.dim() == 2 and is_right_padded(mask):
        kwargs["attention_mask"] = None
    return args, kwargs


def drop_right_padding_mask(model: torch.nn.Module) -> None:
    """Run right-padded batches without their padding mask.

    Causal attention never looks to the right, so in a right-padded row every real token attends to the
    same tokens with or without the mask; the multimodal positions of real tokens do not depend on the
    padding after them either, and padded positions carry no label (the collator gives them -100). Without
    a mask SDPA runs its causal kernels (flash or memory-efficient) instead of an explicit mask's. Logits at
    padded positions do change (they then attend to earlier padding): only the loss and the real positions
    are kept. A left-padded batch keeps its mask. Applying it again replaces the hook."""
    # On the inner Qwen2_5_VLModel: peft's tuner calls the outer model's forward directly, not through its hooks
    target = base_model(model).model
    handle = getattr(target, "_keyshot_padding_free", None)
    if handle is not None:
        handle.remove()
    target._keyshot_padding_free = target.register_forward_pre_hook(_drop_mask, with_kwargs=True)


# ----------------------------------------------------------------------------------------- compile
def compile_layers(model: torch.nn.Module, backend: str = "inductor", decoder: bool = True) -> str:
    """``torch.compile`` each decoder layer (unless ``decoder`` is False) and each vision block in place
    (``nn.Module.compile``); the modules, their parameters and their state dict are unchanged."""
    text, visual = _parts(model)
    eager = 0
    for block in visual.blocks:
        mlp = getattr(block, "mlp", None)
        if mlp is not None and "forward" in mlp.__dict__ and not getattr(mlp, "_keyshot_eager", False):
            # a replaced MLP forward (vision_attention.py's padded frozen product) stays eager: it rebuilds its
            # weights in place when they change, which a compiled graph traced on the old tensors cannot follow
            mlp.forward = torch.compiler.disable(mlp.forward)
            mlp._keyshot_eager = True
        eager += bool(getattr(mlp, "_keyshot_eager", False))
    layers = [*(text.layers if decoder else []), *visual.blocks]
    for layer in layers:
        layer.compile(backend=backend, dynamic=None)
    kept = f" ({eager} vision MLPs left eager)" if eager else ""
    decoders = f"{len(text.layers)} decoder layers" if decoder else "no decoder layer (Liger's run eager)"
    return f"{decoders}, {len(visual.blocks)} vision blocks{kept}"
