"""The batched window attention of the vision tower equals transformers' per-window loop (CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image


def _vision_inputs(model_dir, sizes, max_pixels):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
    batch = processor.image_processor(images=images, return_tensors="pt", max_pixels=max_pixels)
    return batch["pixel_values"], batch["image_grid_thw"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_windows_match_the_per_window_loop(tiny_model_dir, dtype):
    from transformers import AutoModelForImageTextToText

    from keyshot.infer.model.vision_attention import use_batched_window_attention

    reference = AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=dtype, attn_implementation="sdpa"
    )
    batched = AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=dtype, attn_implementation="sdpa"
    )
    assert use_batched_window_attention(batched) == batched.config.vision_config.depth
    # screenshots of several sizes: full windows, edge windows of other lengths, two full-attention images
    pixels, grid = _vision_inputs(tiny_model_dir, [(1280, 720), (700, 2600), (160, 90)], max_pixels=200704)
    with torch.no_grad():
        want = reference.model.visual(pixels.to(dtype), grid_thw=grid)
        got = batched.model.visual(pixels.to(dtype), grid_thw=grid)
    want = want.pooler_output if hasattr(want, "pooler_output") else want
    got = got.pooler_output if hasattr(got, "pooler_output") else got
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_flash_attention_models_are_left_alone(tiny_model_dir):
    from transformers import AutoModelForImageTextToText

    from keyshot.infer.model.vision_attention import use_batched_window_attention

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    for module in model.modules():
        if type(module).__name__ == "Qwen2_5_VLVisionAttention":
            module.config._attn_implementation = "flash_attention_2"
    assert use_batched_window_attention(model) == 0


def _pooled(out):
    return out.pooler_output if hasattr(out, "pooler_output") else out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_vision_tower_matches_transformers(tiny_model_dir, dtype):
    """Batched windows, the patch embedding as a matrix product and MLPs padded to a multiple (48 here, so
    the tiny tower's 128 is padded to 144) give transformers' output, and the checkpoint's tensors are
    untouched (the padded copies live outside the state dict)."""
    from transformers import AutoModelForImageTextToText

    from keyshot.infer.model.vision_attention import (
        use_batched_window_attention,
        use_linear_patch_embed,
        use_padded_vision_mlp,
    )

    reference = AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=dtype, attn_implementation="sdpa"
    )
    fast = AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=dtype, attn_implementation="sdpa"
    )
    shapes = {k: v.shape for k, v in fast.state_dict().items()}
    use_batched_window_attention(fast)
    assert use_linear_patch_embed(fast) == 1
    assert use_padded_vision_mlp(fast, multiple=48) == fast.config.vision_config.depth
    pixels, grid = _vision_inputs(tiny_model_dir, [(1280, 720), (160, 90)], max_pixels=200704)
    with torch.no_grad():
        want = _pooled(reference.model.visual(pixels.to(dtype), grid_thw=grid))
        got = _pooled(fast.model.visual(pixels.to(dtype), grid_thw=grid))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    mlp = fast.model.visual.blocks[0].mlp
    assert mlp._padded[2].shape[1] == 144  # the padded path ran
    assert {k: v.shape for k, v in fast.state_dict().items()} == shapes


def test_padded_mlp_steps_aside_when_the_tower_trains(tiny_model_dir):
    """A trained tower gets gradients through its own weights, and a weight changed in place (an optimizer
    step) is never answered from a stale padded copy."""
    from transformers import AutoModelForImageTextToText

    from keyshot.infer.model.vision_attention import use_padded_vision_mlp

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    use_padded_vision_mlp(model, multiple=48)
    mlp = model.model.visual.blocks[0].mlp
    x = torch.randn(5, mlp.gate_proj.in_features)
    mlp(x).sum().backward()
    assert mlp.gate_proj.weight.grad is not None and not hasattr(mlp, "_padded")
    with torch.no_grad():
        before = mlp(x)
        mlp.up_proj.weight.mul_(2.0)
        after = mlp(x)
        want = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-5)
