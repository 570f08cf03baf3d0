"""LoRA's adapter forward fused into the base product (``model.lora.fused``).

peft computes an adapted layer as ``result + lora_B(lora_A(x)) * scaling``: after the base product, the
adapter's output, its scaling and the sum are three passes over an output-sized tensor, in the forward,
the recompute and the backward (for gate and up of the 7B, 6,800 × 18,944 each at micro-batch 4). Here an
adapted layer is one product for the base with its bias and one ``addmm_`` that adds ``(x @ Aᵀ) @ Bᵀ ×
scaling`` into the base output in place. Layers that take the same input (q, k and v of an attention; gate
and up of an MLP) share one ``x @ [A_q|A_k|A_v]ᵀ``, and their backward accumulates every input gradient
into one tensor in place (``dx = g_q W_q``, then ``dx += g_k W_k``, ``dx += g_v W_v``, ``dx += dxa [A_q|A_k|A_v]``)
instead of summing separate ones. The adapters' weights stay peft's own parameters (no copy is kept; the
concatenated A is built per call, r × in each), so ``save_pretrained``, ``merge_and_unload`` and the
optimizer see what they saw; a layer that peft has merged, disabled or given a second active adapter, or
whose weights DeepSpeed ZeRO-3 holds in shards, runs peft's own forward.

:func:`use_fused_lora` patches a peft model once however often it is called and refuses one it cannot
fuse (no LoRA linear layer, dropout, DoRA, an adapter bias, a non-linear base) in one line. Forward, input
gradient and adapter gradients equal peft's within float32 rounding on the tiny model, with and without
checkpointing (tests/train/test_lora_fused.py).
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass, field

import torch

from keyshot.train.train_config import ModelSetupError

logger = logging.getLogger(__name__)

#: Sibling layers that read the same input (Qwen2/Llama names): one ``x @ [A...]`` serves the group.
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _FusedLoraGroup(torch.autograd.Function):
    """Layers sharing an input ``x``: outputs ``x Wᵢᵀ + bᵢ + sᵢ (x Aᵢᵀ) Bᵢᵀ``.

    ``forward(ctx, x, a_cat, scalings, ranks, *members)``, ``members`` being ``(W, b, B)`` per layer (``b``
    may be None); every tensor in one dtype (cast by the caller, as autocast would)."""

    @staticmethod
    def forward(ctx, x, a_cat, scalings, ranks, *members):
        x2 = x.reshape(-1, x.shape[-1])
        xa = x2 @ a_cat.t()  # (tokens, Σr): every member's x @ Aᵀ in one product
        outs, offset = [], 0
        for i, rank in enumerate(ranks):
            weight, bias, lora_b = members[3 * i : 3 * i + 3]
            out = x.new_empty(*x.shape[:-1], weight.shape[0])
            flat = out.view(-1, weight.shape[0])
            if bias is None:
                torch.mm(x2, weight.t(), out=flat)
            else:
                torch.addmm(bias, x2, weight.t(), out=flat)
            flat.addmm_(xa[:, offset : offset + rank], lora_b.t(), alpha=scalings[i])  # into the base output
            outs.append(out)
            offset += rank
        ctx.scalings, ctx.ranks = scalings, ranks
        ctx.has_bias = [members[3 * i + 1] is not None for i in range(len(ranks))]
        weights = [members[3 * i] for i in range(len(ranks))]
        lora_bs = [members[3 * i + 2] for i in range(len(ranks))]
        ctx.save_for_backward(x, a_cat, xa, *weights, *lora_bs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        x, a_cat, xa, *rest = ctx.saved_tensors
        n = len(ctx.ranks)
        weights, lora_bs = rest[:n], rest[n:]
        x2 = x.reshape(-1, x.shape[-1])
        need = ctx.needs_input_grad
        flat_grads = [g.reshape(-1, w.shape[0]) for g, w in zip(grads, weights, strict=True)]
        dxa_parts, member_grads, offset = [], [], 0
        for i, (g, lora_b) in enumerate(zip(flat_grads, lora_bs, strict=True)):
            rank, scaling = ctx.ranks[i], ctx.scalings[i]
            dxa_parts.append(torch.mm(g, lora_b).mul_(scaling))  # the gradient of this member's x @ Aᵀ
            slot = 4 + 3 * i  # this member's (W, b, B) among forward's inputs
            d_weight = g.t() @ x2 if need[slot] else None
            d_bias = g.sum(0) if need[slot + 1] and ctx.has_bias[i] else None
            d_lora_b = (
                torch.mm(g.t(), xa[:, offset : offset + rank]).mul_(scaling) if need[slot + 2] else None
            )
            member_grads += [d_weight, d_bias, d_lora_b]
            offset += rank
        dxa = torch.cat(dxa_parts, dim=1) if n > 1 else dxa_parts[0]
        dx = None
        if need[0]:
            dx = flat_grads[0] @ weights[0]  # then every other term accumulates into it in place
            for g, weight in zip(flat_grads[1:], weights[1:], strict=True):
                dx.addmm_(g, weight)
            dx.addmm_(dxa, a_cat)
            dx = dx.view(x.shape)
        d_a_cat = dxa.t() @ x2 if need[1] else None
        return (dx, d_a_cat, None, None, *member_grads)


@dataclass(eq=False)
class _Group:
    """Adapted layers fed the same input. The first member called computes every member's output; the others
    take theirs from :attr:`pending` (keyed by the input tensor itself, held until taken)."""

    members: list[torch.nn.Module]
    pending: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = field(default_factory=dict)

    def output(self, member: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        key = id(member)
        held = self.pending.pop(key, None)
        if held is not None and held[0] is x and held[1] == x._version:
            return held[2]
        self.pending.clear()
        outs = _run_group(self.members, x)
        for other, out in zip(self.members, outs, strict=True):
            if other is not member:
                self.pending[id(other)] = (x, x._version, out)
        return outs[self.members.index(member)]


def _compute_dtype(x: torch.Tensor, tensors: list[torch.Tensor]) -> torch.dtype | None:
    """The dtype the products run in: autocast's where it is on, else the one dtype of every tensor (None
    where they differ: peft's own forward decides then)."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    dtypes = {t.dtype for t in tensors}
    return x.dtype if dtypes == {x.dtype} else None


def _unfusable(layer, name: str) -> str | None:
    """Why adapter ``name`` of ``layer`` is not vanilla LoRA the fused product computes, or None."""
    if name in layer.lora_variant:
        return f"adapter {name!r} is a LoRA variant ({type(layer.lora_variant[name]).__name__}, e.g. DoRA)"
    if layer.lora_B[name].bias is not None:
        return f"adapter {name!r} has a bias (lora_bias)"
    if not isinstance(layer.lora_dropout[name], torch.nn.Identity):
        return f"adapter {name!r} has dropout (set model.lora.dropout 0)"
    return None


def _adapter(layer) -> str | None:
    """The one active adapter this layer fuses, or None (merged, disabled, several, or not vanilla LoRA: one
    added after :func:`use_fused_lora` checked the layer)."""
    if layer.disable_adapters or layer.merged:
        return None
    active = [a for a in layer.active_adapters if a in layer.lora_A]
    if len(active) != 1 or _unfusable(layer, active[0]) is not None:
        return None
    return active[0]


def _run_group(members: list[torch.nn.Module], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    names = [_adapter(m) for m in members]
    bases = [m.get_base_layer() for m in members]
    a_weights = [m.lora_A[n].weight for m, n in zip(members, names, strict=True)]
    b_weights = [m.lora_B[n].weight for m, n in zip(members, names, strict=True)]
    tensors = [t for base in bases for t in (base.weight, base.bias) if t is not None] + a_weights + b_weights
    dtype = _compute_dtype(x, tensors)
    a_cat = torch.cat([a.to(dtype) for a in a_weights]) if len(a_weights) > 1 else a_weights[0].to(dtype)
    flat: list = []
    for base, lora_b in zip(bases, b_weights, strict=True):
        bias = base.bias.to(dtype) if base.bias is not None else None
        flat += [base.weight.to(dtype), bias, lora_b.to(dtype)]
    scalings = tuple(float(m.scaling[n]) for m, n in zip(members, names, strict=True))
    ranks = tuple(int(a.shape[0]) for a in a_weights)
    return _FusedLoraGroup.apply(x.to(dtype), a_cat, scalings, ranks, *flat)


def _fusable(member: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether every layer of ``member``'s group can take the fused path for ``x`` now. Not where DeepSpeed
    ZeRO-3 holds the weights in shards: it gathers a module's weights around that module's own forward,
    which the fused product does not call."""
    group: _Group = member._keyshot_lora_group
    names = [_adapter(m) for m in group.members]
    if None in names or any(hasattr(p, "ds_id") for m in group.members for p in m.parameters()):
        return False
    name = names[group.members.index(member)]
    tensors = [member.get_base_layer().weight, member.lora_A[name].weight, member.lora_B[name].weight]
    return _compute_dtype(x, tensors) is not None


def _fused_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if args or kwargs or not _fusable(self, x):  # peft's own forward: merged, mixed batches, ...
        return type(self).forward(self, x, *args, **kwargs)
    return self._keyshot_lora_group.output(self, x)


def _refusal(layer) -> str | None:
    """Why ``layer`` (a peft LoRA Linear) cannot be fused, or None."""
    base = layer.get_base_layer()
    if type(base) is not torch.nn.Linear:
        return f"its base layer is a {type(base).__name__}, not torch.nn.Linear"
    if getattr(layer, "fan_in_fan_out", False):
        return "fan_in_fan_out is set"
    return next((why for name in layer.lora_A if (why := _unfusable(layer, name)) is not None), None)


def use_fused_lora(model: torch.nn.Module) -> int:
    """Run every peft LoRA linear layer of ``model`` through the fused forward; returns how many do (those
    patched by an earlier call included: a second call changes nothing). Raises :class:`ModelSetupError`
    naming the layer where one cannot be fused, and where ``model`` has no LoRA linear layer at all."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}
    if not layers:
        raise ModelSetupError(
            f"model.lora.fused found no peft LoRA linear layer in {type(model).__name__} (a peft upgrade may "
            "have renamed peft.tuners.lora.layer.Linear): set model.lora.fused=false"
        )
    for name, layer in layers.items():
        if (why := _refusal(layer)) is not None:
            raise ModelSetupError(f"model.lora.fused cannot fuse {name}: {why}")
    fused = shared = 0
    for members in _groups(layers):
        if all("_keyshot_lora_group" in m.__dict__ for m in members):
            fused += len(members)
            continue
        group = _Group(members)
        for member in members:
            member._keyshot_lora_group = group
            member.forward = types.MethodType(_fused_forward, member)
        fused += len(members)
        shared += len(members) > 1
    logger.info("LoRA fused: %d adapted layers, %d groups sharing one x @ A", fused, shared)
    return fused


def _groups(layers: dict[str, torch.nn.Module]) -> list[list[torch.nn.Module]]:
    """The layers in groups that read one input: :data:`SHARED_INPUT` siblings of one parent with the same
    input width; every other layer alone."""
    grouped: set[str] = set()
    out: list[list[torch.nn.Module]] = []
    for name in layers:
        parent, _, leaf = name.rpartition(".")
        for siblings in SHARED_INPUT:
            if leaf != siblings[0]:
                continue
            names = [
                f"{parent}.{s}" if parent else s
                for s in siblings
                if (f"{parent}.{s}" if parent else s) in layers
            ]
            widths = {layers[n].get_base_layer().in_features for n in names}
            if len(names) > 1 and len(widths) == 1:
                out.append([layers[n] for n in names])
                grouped.update(names)
    out += [[layer] for name, layer in layers.items() if name not in grouped]
    return out


def fused_layers(model: torch.nn.Module) -> int:
    """How many layers of ``model`` run the fused forward."""
    return sum(1 for m in model.modules() if "_keyshot_lora_group" in m.__dict__)
