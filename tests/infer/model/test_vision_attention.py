"""The batched window attention of the vision tower equals transformers' per-window loop (CPU)."""

from __future__ import annotations

import pytest
import torch

from tests.support.tiny_model import pooled, vision_inputs


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
    pixels, grid = vision_inputs(tiny_model_dir, [(1280, 720), (700, 2600), (160, 90)], max_pixels=200704)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_vision_tower_matches_transformers(tiny_model_dir, dtype):
    """Batched windows, the patch embedding as a matrix product and MLPs padded to a multiple (48 here, so
    the tiny tower's 128 is padded to 144) give transformers' output, and the state dict keeps the
    checkpoint's shapes (the padding lives in the buffers the weights are views of)."""
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
    pixels, grid = vision_inputs(tiny_model_dir, [(1280, 720), (160, 90)], max_pixels=200704)
    with torch.no_grad():
        want = pooled(reference.model.visual(pixels.to(dtype), grid_thw=grid))
        got = pooled(fast.model.visual(pixels.to(dtype), grid_thw=grid))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    mlp = fast.model.visual.blocks[0].mlp
    assert mlp._padded[0].shape[0] == 2 * 144 and mlp._padded[2].shape[0] == 144  # the padded path ran
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
    assert mlp.gate_proj.weight.grad is not None and "_padded" not in mlp.__dict__
    with torch.no_grad():
        before = mlp(x)
        mlp.up_proj.weight.mul_(2.0)
        after = mlp(x)
        want = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-5)


def _tiny(model_dir, dtype=torch.float32):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")


def _storage_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def test_patches_apply_once_however_often_called(tiny_model_dir):
    """use_fast_vision_tower twice (the recipe's prepare_for_training, then the in-process scorer) and then
    training the tower: once raised RecursionError (the second patch wrapped the first)."""
    from keyshot.infer.model.vision_attention import (
        use_batched_window_attention,
        use_fast_vision_tower,
        use_linear_patch_embed,
        use_padded_vision_mlp,
    )

    reference, model = _tiny(tiny_model_dir), _tiny(tiny_model_dir)
    depth = model.config.vision_config.depth
    use_fast_vision_tower(model)
    forwards = {n: m.__dict__.get("forward") for n, m in model.named_modules()}
    use_fast_vision_tower(model)
    assert use_batched_window_attention(model) == depth and use_linear_patch_embed(model) == 1
    assert use_padded_vision_mlp(model) == depth
    assert {n: m.__dict__.get("forward") for n, m in model.named_modules()} == forwards
    pixels, grid = vision_inputs(tiny_model_dir, [(640, 360)], max_pixels=200704)
    with torch.inference_mode():  # the in-process scorer's forward pads the MLPs in place
        pooled(model.model.visual(pixels, grid_thw=grid))
    assert all("_padded" in b.mlp.__dict__ for b in model.model.visual.blocks)
    want = pooled(reference.model.visual(pixels, grid_thw=grid))
    got = pooled(model.model.visual(pixels, grid_thw=grid))  # the tower trains: its own modules run
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    tower = list(model.model.visual.blocks.parameters())
    assert all(p.grad is not None and p.grad.stride() == p.stride() for p in tower)
    torch.optim.AdamW(tower, lr=1e-2, fused=True).step()  # the padded views take a fused step in place
    with torch.no_grad():
        mlp = model.model.visual.blocks[0].mlp
        x = torch.randn(3, mlp.gate_proj.in_features)
        want = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-5)


def test_padding_keeps_no_second_copy_of_the_weights(tiny_model_dir, tmp_path):
    """The padded MLPs hold the tower's weights once: the model's storage grows by the zero padding alone
    (it held a second, padded copy of every MLP before), an in-place change reaches the padded product, and
    the saved checkpoint is transformers' own layout and values."""
    from transformers import AutoModelForImageTextToText

    from keyshot.infer.model.vision_attention import use_padded_vision_mlp

    model = _tiny(tiny_model_dir)
    model.requires_grad_(False)
    before = _storage_bytes(list(model.parameters()) + list(model.buffers()))
    use_padded_vision_mlp(model, multiple=48)
    pixels, grid = vision_inputs(tiny_model_dir, [(640, 360)], max_pixels=200704)
    with torch.no_grad():
        first = pooled(model.model.visual(pixels, grid_thw=grid))
    mlps = [b.mlp for b in model.model.visual.blocks]
    assert all("_padded" in m.__dict__ for m in mlps)
    held = (
        list(model.parameters())
        + list(model.buffers())
        + [t for m in mlps for t in m._padded if t is not None]
    )
    mlp = mlps[0]
    n, hidden, pad = mlp.gate_proj.out_features, mlp.gate_proj.in_features, 144 - 128
    bias = 2 * pad if mlp.gate_proj.bias is not None else 0
    padding = len(mlps) * (2 * pad * hidden + bias + pad * mlp.down_proj.out_features) * 4
    assert n == 128 and _storage_bytes(held) == before + padding
    with torch.no_grad():
        mlp.up_proj.weight.mul_(2.0)  # as an optimizer step or a loaded state dict writes
        x = torch.randn(3, hidden)
        want = mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
        torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-5)
        mlp.up_proj.weight.div_(2.0)
    model.save_pretrained(tmp_path / "saved")
    again = AutoModelForImageTextToText.from_pretrained(tmp_path / "saved", attn_implementation="sdpa")
    reference = _tiny(tiny_model_dir).state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in again.state_dict().items())
    # a training checkpoint (accelerate's save_state: the state dict through safetensors, which refuses
    # tensors sharing a storage) holds every weight, and loads back into the padded views
    from safetensors.torch import load_file, save_file

    save_file(model.state_dict(), tmp_path / "state.safetensors")
    state = load_file(tmp_path / "state.safetensors")
    assert state.keys() == reference.keys() and all(torch.equal(v, reference[k]) for k, v in state.items())
    with torch.no_grad():
        mlp.up_proj.weight.zero_()
    model.load_state_dict(state)
    assert torch.equal(mlp.up_proj.weight, reference["model.visual.blocks.0.mlp.up_proj.weight"])
    assert mlp.up_proj.weight.data_ptr() == mlp._padded[0][mlp._padded[0].shape[0] // 2].data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(
            pooled(again.model.visual(pixels, grid_thw=grid)), first, rtol=1e-5, atol=1e-5
        )
        model.to(torch.bfloat16)  # the parameters become tensors of their own: padded again, in bfloat16
        model.model.visual(pixels.to(torch.bfloat16), grid_thw=grid)
    assert (
        mlp._padded[0].dtype == torch.bfloat16
        and mlp.gate_proj.weight.data_ptr() == mlp._padded[0].data_ptr()
    )


@pytest.mark.parametrize(
    ("patch", "renamed"),
    [
        ("use_batched_window_attention", "Qwen2_5_VLVisionAttention"),
        ("use_linear_patch_embed", "Qwen2_5_VisionPatchEmbed"),
        ("use_padded_vision_mlp", "Qwen2_5_VLMLP"),
        ("use_grid_packing", "Qwen2_5_VisionTransformerPretrainedModel"),  # vision_packing.py's
        ("use_grid_packing", "get_vision_window_index"),  # a helper the tower's forward no longer calls
    ],
)
def test_a_patch_says_when_it_found_nothing_to_patch(tiny_model_dir, monkeypatch, caplog, patch, renamed):
    """A transformers that renamed the patched class leaves the Qwen2.5-VL unpatched, and says so; a model
    that is no Qwen2.5-VL is left alone in silence."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

    from keyshot.infer.model import vision_attention

    model = _tiny(tiny_model_dir)
    monkeypatch.delattr(modeling_qwen2_5_vl, renamed)
    with caplog.at_level("WARNING", logger=vision_attention.__name__):
        assert getattr(vision_attention, patch)(model) == 0
        assert getattr(vision_attention, patch)(torch.nn.Linear(2, 2)) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        len(warnings) == 1 and "nothing patched in this Qwen2.5-VL" in warnings[0] and renamed in warnings[0]
    )
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert not model.model.visual._forward_pre_hooks  # no packing hook either


def test_window_attention_says_when_its_forward_changed(tiny_model_dir, monkeypatch, caplog):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionAttention

    from keyshot.infer.model.vision_attention import use_batched_window_attention

    model = _tiny(tiny_model_dir)
    monkeypatch.setattr(
        Qwen2_5_VLVisionAttention, "forward", lambda self, hidden_states, lengths: hidden_states
    )
    with caplog.at_level("WARNING"):
        assert use_batched_window_attention(model) == 0
    assert any("arguments changed" in r.getMessage() for r in caplog.records)
