"""The rules every patch of transformers' Qwen2.5-VL in this room keeps (docs/training.md: each patch applies once and says when it found nothing to patch): find the
class by name in this transformers, and say so when a Qwen2.5-VL holds nothing to patch (an upgrade that
renamed a class or changed a forward's arguments would otherwise switch a patch off in silence)."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def looks_like_qwen25_vl(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds modules of transformers' Qwen2.5-VL (whatever their classes are called)."""
    return any("qwen2_5_vl" in type(m).__module__ for m in model.modules())


def qwen25_vl_class(name: str):
    """transformers' Qwen2.5-VL class ``name``, or None where this transformers has none of that name."""
    try:
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl
    except ImportError:
        return None
    return getattr(modeling_qwen2_5_vl, name, None)


def nothing_patched(model: torch.nn.Module, what: str, why: str) -> int:
    """0 patched, said in a warning when ``model`` is a Qwen2.5-VL (``why``: what was not found)."""
    if looks_like_qwen25_vl(model):
        logger.warning(
            "%s: nothing patched in this Qwen2.5-VL (%s); transformers' own forward runs", what, why
        )
    return 0
