"""Qwen2.5-VL's vision tower without flash-attn: every layer's windows in a few batched SDPA calls.

The vision tower attends within windows (most layers) or within each image (a few full layers). With
flash-attn, transformers runs them as one variable-length call. Without it (the default ``sdpa``
path), transformers splits the sequence at every window boundary and calls attention once per window:
a 1280×720 screenshot is ~75 windows of 64 patches, so each layer makes ~75 tiny calls, and on an
H100 the tower then runs at a few percent of peak.

:func:`use_batched_window_attention` replaces that loop in a model's vision attention modules: the
windows are grouped by length (nearly all windows are full; edge windows are shorter), and each group
is ONE ``scaled_dot_product_attention`` call over a batch of windows. No padding and no mask, so every
window attends exactly as before (checked against transformers' own path in tests/infer/model/test_vision_attention.py).
With flash-attn (``attn_implementation="flash_attention_2"``) nothing is changed.

Two more changes make the tower fast on a GPU (bench/RESULTS-gpu.md, H200 at the 7B shape: 16 -> 22
screenshots/s at batch 1, 25 -> 34 at batch 8): :func:`use_linear_patch_embed` runs the patch
embedding (a Conv3d whose kernel is its stride) as one matrix product, and :func:`use_padded_vision_mlp`
runs each MLP over an intermediate padded with zeros to a multiple of 128 (the 7B's 3,420 is no multiple
of 16, which cuBLAS pays for), gate and up in one product. The padding is done once, in place: gate and up
become views of one zero-padded buffer and down of another, so the model holds its weights once (plus the
padding) and an optimizer step or a loaded state dict updates the padded product too; where the tower
trains, its own modules run. :func:`use_fast_vision_tower` applies all three (the scorer and the training
recipe call it).

Each patch is applied once however often it is called (a second call changes nothing and counts the
layers already patched), and says in a warning when it found nothing to patch in a Qwen2.5-VL: a transformers
upgrade that renamed a class or changed a forward's arguments would otherwise switch it off in silence
(tests/infer/model/test_vision_attention.py).
"""

from __future__ import annotations

import inspect
import logging
import types

import torch
import torch.nn.functional as F

from keyshot.infer.model.patch_rules import nothing_patched, qwen25_vl_class
from keyshot.infer.model.vision_packing import WINDOW_GROUPS, use_grid_packing, window_groups

logger = logging.getLogger(__name__)


def _batched_forward(
    self,
    hidden_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_seqlen: int | None = None,
    **kwargs,
) -> torch.Tensor:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

    seq_length = hidden_states.shape[0]
    q, k, v = self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb_vision(q, k, cos, sin)  # (seq, heads, head_dim)
    groups = getattr(cu_seqlens, WINDOW_GROUPS, None)  # the tower's packing from its grid: no host sync
    if groups is None:
        groups = window_groups(cu_seqlens, q.device)
    out = torch.empty_like(q)
    dropout = self.attention_dropout if self.training else 0.0
    for _length, index in groups:
        qb, kb, vb = (t[index].transpose(1, 2) for t in (q, k, v))  # (windows, heads, length, head_dim)
        attended = F.scaled_dot_product_attention(qb, kb, vb, dropout_p=dropout, scale=self.scaling)
        out[index] = attended.transpose(1, 2).to(out.dtype)
    return self.proj(out.reshape(seq_length, -1))


def _takes(cls, *names: str) -> bool:
    """Whether ``cls.forward`` takes each of ``names`` (the arguments a replacement relies on)."""
    try:
        parameters = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False
    return all(n in parameters for n in names)


def _runs(module: torch.nn.Module, function) -> bool:
    """Whether ``module``'s forward is already ``function`` (patched before)."""
    return getattr(module.__dict__.get("forward"), "__func__", None) is function


def _patch_forwards(
    model: torch.nn.Module,
    root: torch.nn.Module,
    cls: type,
    forward,
    what: str,
    none_found: str,
    refuse=None,
    on_patch=None,
) -> int:
    """The one rule of every patch here: each ``cls`` module under ``root`` runs ``forward`` once, however
    often this is called (a module already running it counts; one running another switch's forward is left
    as it is). ``refuse(module)`` says why a module cannot take it (warned, left; ``""``: left silently);
    ``on_patch(module)`` readies a module before its forward is replaced. Returns how many run ``forward``;
    says when ``model`` is a Qwen2.5-VL and no such module was found (``none_found``)."""
    patched = found = 0
    for module in root.modules():
        if not isinstance(module, cls):
            continue
        found += 1
        why = refuse(module) if refuse is not None else None
        if why is not None:
            if why:
                logger.warning("%s: %s; left as it is", what, why)
            continue
        if not _runs(module, forward):
            if "forward" in module.__dict__:  # someone else's forward (another switch): left as it is
                continue
            if on_patch is not None:
                on_patch(module)
            module.forward = types.MethodType(forward, module)
        patched += 1
    if not found:
        return nothing_patched(model, what, none_found)
    return patched


def use_batched_window_attention(model: torch.nn.Module) -> int:
    """Patch every Qwen2.5-VL vision attention module of ``model`` that does not use flash-attn; returns how
    many run the batched windows (those patched by an earlier call included)."""
    what = "batched vision windows"
    cls = qwen25_vl_class("Qwen2_5_VLVisionAttention")
    if cls is None:
        return nothing_patched(model, what, "transformers has no Qwen2_5_VLVisionAttention")
    if not _takes(cls, "hidden_states", "cu_seqlens", "position_embeddings"):
        return nothing_patched(model, what, "Qwen2_5_VLVisionAttention.forward's arguments changed")

    def refuse(module) -> str | None:  # flash-attn runs its own varlen kernel: nothing to batch
        implementation = getattr(module.config, "_attn_implementation", "sdpa") or "sdpa"
        return "" if "flash" in implementation else None

    patched = _patch_forwards(
        model, model, cls, _batched_forward, what, "no Qwen2_5_VLVisionAttention module", refuse
    )
    if patched:
        logger.info("vision attention: %d layers run their windows as batched SDPA calls", patched)
    return patched


def _linear_patch_embed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # Conv3d with kernel == stride over one patch each is a matrix product over the flattened patch.
    weight = self.proj.weight
    return F.linear(
        hidden_states.to(weight.dtype).reshape(-1, weight[0].numel()), weight.reshape(weight.shape[0], -1)
    )


def use_linear_patch_embed(model: torch.nn.Module) -> int:
    """Run Qwen2.5-VL's patch embedding (a Conv3d whose kernel is its stride) as the matrix product it is;
    returns how many run so (those patched by an earlier call included)."""
    what = "patch embedding as a matrix product"
    cls = qwen25_vl_class("Qwen2_5_VisionPatchEmbed")
    if cls is None:
        return nothing_patched(model, what, "transformers has no Qwen2_5_VisionPatchEmbed")

    def refuse(module) -> str | None:
        proj = getattr(module, "proj", None)
        if (
            isinstance(proj, torch.nn.Conv3d)
            and proj.kernel_size == proj.stride
            and proj.bias is None
            and proj.padding == (0, 0, 0)
        ):
            return None
        return f"{cls}'s proj is no bias-free Conv3d with kernel = stride"

    return _patch_forwards(
        model, model, cls, _linear_patch_embed_forward, what, "no Qwen2_5_VisionPatchEmbed module", refuse
    )


def _partitioned(module: torch.nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 holds ``module``'s weights in shards (gathered only around each submodule's
    own forward: the padded product, which reads them directly, cannot run)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def _pad_in_place(mlp: torch.nn.Module) -> None:
    """Move gate, up and down into zero-padded buffers whose views they become: the weights stay held once."""
    gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    n, multiple = gate.out_features, mlp._pad_multiple
    padded = -(-n // multiple) * multiple
    # Outside inference mode even when called in it: the parameters must stay usable by autograd afterwards.
    with torch.inference_mode(False), torch.no_grad():
        w = gate.weight.new_zeros(2 * padded, gate.in_features)  # rows: gate, zeros, up, zeros
        w[:n], w[padded : padded + n] = gate.weight, up.weight
        gate.weight.data, up.weight.data = w[:n], w[padded : padded + n]
        b = None
        if gate.bias is not None:
            b = gate.bias.new_zeros(2 * padded)
            b[:n], b[padded : padded + n] = gate.bias, up.bias
            gate.bias.data, up.bias.data = b[:n], b[padded : padded + n]
        d = down.weight.new_zeros(
            padded, down.out_features
        )  # down's weight transposed: padded rows at the end
        d[:n] = down.weight.t()
        down.weight.data = d[:n].t()
    mlp._padded = (w, b, d)


def _padding_holds(mlp: torch.nn.Module) -> bool:
    """Whether gate, up and down are still the views of the padded buffers (a ``.to()`` of the model, or a
    load that replaced a parameter's tensor, makes them tensors of their own: then the padding is redone)."""
    padded = mlp.__dict__.get("_padded")
    if padded is None:
        return False
    w, b, d = padded
    half = w.shape[0] // 2
    gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    views = [(gate.weight, w, 0), (up.weight, w, half), (down.weight, d, 0)]
    if b is not None:
        views += [(gate.bias, b, 0), (up.bias, b, half)]
    return all(
        p is not None
        and p.device == base.device
        and p.dtype == base.dtype
        and p.data_ptr() == base[row].data_ptr()
        for p, base, row in views
    )


def _padded_mlp_forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
    if (torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())) or _partitioned(self):
        return type(self).forward(self, hidden_state)  # a trained tower (or ZeRO-3 shards): its own modules
    if not _padding_holds(self):
        _pad_in_place(self)
    w, b, d = self._padded
    g, u = F.linear(hidden_state, w, b).chunk(2, dim=-1)
    return F.linear(self.act_fn(g) * u, d.t(), self.down_proj.bias)


def _contiguous_state(module, state_dict, prefix, local_metadata) -> None:
    """Once padded, gate and up are views of one buffer and down a transposed view of another: the state
    dict gets each as a tensor of its own (safetensors saves no view, and keeps one of the tensors sharing a
    storage: accelerate's ``save_state`` dropped ``up_proj`` and the resumed run could not load it); the
    parameters themselves (``keep_vars=True``) are left as they are, and loading copies into the views."""
    padded = module.__dict__.get("_padded")
    buffers = {t.untyped_storage().data_ptr() for t in padded or () if t is not None}
    for key in ("gate_proj.weight", "up_proj.weight", "down_proj.weight", "gate_proj.bias", "up_proj.bias"):
        value = state_dict.get(prefix + key)
        if value is None or isinstance(value, torch.nn.Parameter):
            continue
        if not value.is_contiguous() or value.untyped_storage().data_ptr() in buffers:
            state_dict[prefix + key] = value.clone(memory_format=torch.contiguous_format)


def use_padded_vision_mlp(model: torch.nn.Module, multiple: int = 128) -> int:
    """Run the vision MLPs (intermediate 3,420 in the 7B: no multiple of 16) as one gate+up product and one
    down product over an intermediate padded with zeros to ``multiple``, where no gradient is asked of them;
    returns how many run so (those patched by an earlier call included). The weights are padded in place at
    the first such forward (see :func:`_pad_in_place`): no second copy."""
    what = "padded vision MLPs"
    cls = qwen25_vl_class("Qwen2_5_VLMLP")
    if cls is None:
        return nothing_patched(model, what, "transformers has no Qwen2_5_VLMLP")
    visual = getattr(getattr(model, "model", model), "visual", model)

    def refuse(module) -> str | None:
        parts = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if all(isinstance(p, torch.nn.Linear) for p in parts) and hasattr(module, "act_fn"):
            return None
        return f"{cls} has no gate_proj, up_proj, down_proj and act_fn"

    def ready(module) -> None:
        module._pad_multiple = multiple
        module.register_state_dict_post_hook(_contiguous_state)

    return _patch_forwards(
        model,
        visual,
        cls,
        _padded_mlp_forward,
        what,
        "no Qwen2_5_VLMLP module in the vision tower",
        refuse,
        ready,
    )


def use_fast_vision_tower(model: torch.nn.Module) -> None:
    """Every change above, each equal to transformers' output within the dtype's rounding: batched windows,
    the patch embedding as a matrix product, padded vision MLPs (where the tower asks no gradient), and the
    tower's packing read from its grid before the layers (vision_packing.py: no host sync per layer). Applied
    once however often it is called (the training recipe and the in-process scorer each call it)."""
    use_batched_window_attention(model)
    use_linear_patch_embed(model)
    use_padded_vision_mlp(model)
    use_grid_packing(model)
