"""Qwen2.5-VL's vision windows through torch's own variable-length attention (``model.vision_attention=varlen``).

The tower's windows (and, in its few full-attention layers, its images) are sequences packed one after
another, delimited by ``cu_seqlens``. transformers runs them as one variable-length call only with
flash-attn; :mod:`keyshot.infer.model.vision_attention` batches same-length windows into a few SDPA calls,
which gathers and scatters every window's queries, keys and values. torch >= 2.10 has its own
variable-length flash kernel, :func:`torch.nn.attention.varlen.varlen_attn`, which reads the packed
sequence as it lies: one call per layer, no gather, no flash-attn package. Its kernel runs on CUDA in
bfloat16 or float16 only; elsewhere the forward refuses in one line (``keyshot.train.speedups`` refuses the
setting before a model runs).
"""

from __future__ import annotations

import logging
import types

import torch

logger = logging.getLogger(__name__)

VARLEN_DTYPES = (torch.bfloat16, torch.float16)


class VarlenUnavailable(RuntimeError):
    """torch's variable-length attention cannot run here (no such module, no CUDA, or a float32 tower)."""


def varlen_attention_function():
    """torch's ``varlen_attn``, or :class:`VarlenUnavailable` naming what is missing."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise VarlenUnavailable(
            f"model.vision_attention=varlen needs torch >= 2.10 (torch.nn.attention.varlen); this is torch "
            f"{torch.__version__}: use vision_attention=batched"
        ) from exc
    return varlen_attn


def _varlen_forward(
    self,
    hidden_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_seqlen: int | torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision

    seq_length = hidden_states.shape[0]
    q, k, v = self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb_vision(
        q, k, cos, sin
    )  # (seq, heads, head_dim): the packed layout varlen reads
    if not q.is_cuda or q.dtype not in VARLEN_DTYPES:
        raise VarlenUnavailable(
            f"model.vision_attention=varlen runs on CUDA in bfloat16/float16; the tower runs on {q.device.type} "
            f"in {q.dtype}: use vision_attention=batched"
        )
    if max_seqlen is None:  # the tower's packing passes it (vision_packing.py); else one host sync per layer
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    v = v.to(q.dtype)
    # no scale argument: the tower's is the kernel's default 1/sqrt(head_dim) (checked when patched), and
    # not every torch release's varlen_attn takes one
    out = self._varlen_attn(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen))
    return self.proj(out.reshape(seq_length, -1))


def use_varlen_vision_attention(model: torch.nn.Module) -> int:
    """Patch every Qwen2.5-VL vision attention module of ``model`` to run its windows through torch's
    variable-length attention; returns how many were patched (the tower's depth), and refuses a model with
    none. Applying it again patches the same modules again (the forward is replaced, never wrapped). The
    tower gets its packing from the grid (:func:`~keyshot.infer.model.vision_packing.use_grid_packing`), so
    each layer is handed its ``max_seqlen`` and reads nothing back from the device."""
    from keyshot.infer.model.vision_packing import use_grid_packing

    varlen_attn = varlen_attention_function()
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionAttention

    patched = 0
    for module in model.modules():
        if isinstance(module, Qwen2_5_VLVisionAttention):
            if abs(module.scaling - module.head_dim**-0.5) > 1e-12:
                raise VarlenUnavailable(
                    f"model.vision_attention=varlen: the tower's attention scale {module.scaling} is not "
                    f"1/sqrt(head_dim); use vision_attention=batched"
                )
            module._varlen_attn = varlen_attn
            module.forward = types.MethodType(_varlen_forward, module)
            patched += 1
    if not patched:  # asked for by name: finding nothing is an error, not a silent no-op
        raise VarlenUnavailable(
            f"model.vision_attention=varlen found no Qwen2_5_VLVisionAttention in {type(model).__name__} (a "
            "transformers upgrade may have renamed it): use vision_attention=batched"
        )
    use_grid_packing(model)
    logger.info("vision attention: %d layers run their windows through torch's varlen_attn", patched)
    return patched
