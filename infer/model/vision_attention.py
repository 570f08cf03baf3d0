"""Qwen2.5-VL's vision tower without flash-attn: every layer's windows in a few batched SDPA calls.

The vision tower attends within windows (most layers) or within each image (a few full layers). With
flash-attn, transformers runs them as one variable-length call. Without it (the default ``sdpa``
path), transformers splits the sequence at every window boundary and calls attention once per window:
a 1280×720 screenshot is ~75 windows of 64 patches, so each layer makes ~75 tiny calls, and on an
H100 the tower then runs at a few percent of peak.

:func:`use_batched_window_attention` replaces that loop in a model's vision attention modules: the
windows are grouped by length (nearly all windows are full; edge windows are shorter), and each group
is ONE ``scaled_dot_product_attention`` call over a batch of windows. No padding and no mask, so every
window attends exactly as before (checked against transformers' own path in tests/test_vision_attention.py).
With flash-attn (``attn_implementation="flash_attention_2"``) nothing is changed.

Two more changes make the tower fast on a GPU (bench/RESULTS-gpu.md, H200 at the 7B shape: 16 -> 22
screenshots/s at batch 1, 25 -> 34 at batch 8): :func:`use_linear_patch_embed` runs the patch
embedding (a Conv3d whose kernel is its stride) as one matrix product, and :func:`use_padded_vision_mlp`
runs each MLP over an intermediate padded with zeros to a multiple of 128 (the 7B's 3,420 is no multiple
of 16, which cuBLAS pays for), gate and up in one product, from copies kept outside the state dict and
rebuilt when a weight changes; where the tower trains, its own weights run. :func:`use_fast_vision_tower`
applies all three (the scorer and the training recipe call it).
"""

from __future__ import annotations

import logging
import types
from collections import defaultdict

import torch
import torch.nn.functional as F

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
    bounds = cu_seqlens.tolist()  # one host sync per layer, as transformers' own loop makes
    by_length: dict[int, list[int]] = defaultdict(list)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            by_length[end - start].append(start)
    out = torch.empty_like(q)
    dropout = self.attention_dropout if self.training else 0.0
    for length, starts in by_length.items():
        index = (
            torch.tensor(starts, device=q.device)[:, None] + torch.arange(length, device=q.device)[None, :]
        )
        qb, kb, vb = (t[index].transpose(1, 2) for t in (q, k, v))  # (windows, heads, length, head_dim)
        attended = F.scaled_dot_product_attention(qb, kb, vb, dropout_p=dropout, scale=self.scaling)
        out[index] = attended.transpose(1, 2).to(out.dtype)
    return self.proj(out.reshape(seq_length, -1))


def use_batched_window_attention(model: torch.nn.Module) -> int:
    """Patch every Qwen2.5-VL vision attention module of ``model`` that does not use flash-attn;
    returns how many were patched."""
    try:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionAttention
    except ImportError:  # an older or newer transformers without this class: leave the model as it is
        return 0
    patched = 0
    for module in model.modules():
        if not isinstance(module, Qwen2_5_VLVisionAttention):
            continue
        implementation = getattr(module.config, "_attn_implementation", "sdpa") or "sdpa"
        if "flash" in implementation:
            continue
        module.forward = types.MethodType(_batched_forward, module)
        patched += 1
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
    """Run Qwen2.5-VL's patch embedding (a Conv3d whose kernel is its stride) as the matrix product it is."""
    try:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed
    except ImportError:
        return 0
    patched = 0
    for module in model.modules():
        if isinstance(module, Qwen2_5_VisionPatchEmbed):
            module.forward = types.MethodType(_linear_patch_embed_forward, module)
            patched += 1
    return patched


def _padded_mlp_forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
    gate, up, down = self.gate_proj, self.up_proj, self.down_proj
    if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
        return self._unpadded_forward(hidden_state)
    key = (gate.weight.device, gate.weight.dtype, *(p._version for p in self.parameters()))
    if getattr(self, "_padded_key", None) != key:
        n, multiple = gate.out_features, self._pad_multiple
        padded = -(-n // multiple) * multiple
        with torch.no_grad():
            w = gate.weight.new_zeros(2, padded, gate.in_features)
            w[0, :n], w[1, :n] = gate.weight, up.weight
            b = gate.weight.new_zeros(2, padded)
            if gate.bias is not None:
                b[0, :n], b[1, :n] = gate.bias, up.bias
            d = down.weight.new_zeros(down.out_features, padded)
            d[:, :n] = down.weight
        self._padded = (w.reshape(2 * padded, -1), b.reshape(-1), d)
        self._padded_key = key
    w, b, d = self._padded
    g, u = F.linear(hidden_state, w, b).chunk(2, dim=-1)
    return F.linear(self.act_fn(g) * u, d, down.bias)


def use_padded_vision_mlp(model: torch.nn.Module, multiple: int = 128) -> int:
    """Run the vision MLPs (intermediate 3,420 in the 7B: no multiple of 16) as one gate+up product and one
    down product over an intermediate padded with zeros to ``multiple``, where no gradient is asked of them."""
    try:
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP
    except ImportError:
        return 0
    visual = getattr(getattr(model, "model", model), "visual", model)
    patched = 0
    for module in visual.modules():
        if isinstance(module, Qwen2_5_VLMLP):
            module._unpadded_forward = module.forward
            module._pad_multiple = multiple
            module.forward = types.MethodType(_padded_mlp_forward, module)
            patched += 1
    return patched


def use_fast_vision_tower(model: torch.nn.Module) -> None:
    """Every change above, each equal to transformers' output within the dtype's rounding: batched windows,
    the patch embedding as a matrix product, padded vision MLPs (where the tower asks no gradient)."""
    use_batched_window_attention(model)
    use_linear_patch_embed(model)
    use_padded_vision_mlp(model)
