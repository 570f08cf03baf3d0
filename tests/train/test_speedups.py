"""The speed switches of ``model.*`` (keyshot.train.speedups): each gives transformers' output on the tiny
Qwen2.5-VL within the dtype's rounding; where a switch cannot run here it refuses in one line. The kernels
that need CUDA (Liger's Triton kernels, torch's varlen_attn, inductor on a GPU) are checked by the tests
marked ``gpu`` (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from keyshot.infer.common.config import ConfigError
from keyshot.train.scorer_model import ModelSetupError
from keyshot.train.speedups import apply_speedups, is_right_padded
from keyshot.train.train_config import LoraSettings, ModelSettings
from tests.support.tiny_model import load_tiny, prepare_seeded, tiny_settings


def _step(model, batch, device="cpu"):
    """Loss, labelled-position logits and the trainable parameters' gradients of one training step."""
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(**{k: v.to(device) for k, v in batch.items()})
    out.loss.backward()
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    keep = batch["labels"] != -100
    return out.loss.detach().float().cpu(), out.logits.detach()[keep.to(device)].float().cpu(), grads


def _assert_same_step(got, want, tol):
    loss, logits, grads = got
    want_loss, want_logits, want_grads = want
    torch.testing.assert_close(loss, want_loss, rtol=tol, atol=tol)
    torch.testing.assert_close(logits, want_logits, rtol=tol, atol=tol)
    assert grads.keys() == want_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], rtol=tol, atol=tol, msg=name)


# ------------------------------------------------------------------------------------------------ config
def test_switches_are_off_by_default_and_checked():
    settings = ModelSettings()
    assert (settings.liger_kernel, settings.compile, settings.vision_attention, settings.padding_free) == (
        False,
        "off",
        "batched",
        False,
    )
    assert settings.checkpoint_every == 1
    with pytest.raises(ConfigError, match="model.checkpoint_every must be >= 1"):
        ModelSettings(checkpoint_every=0)


def test_the_switches_are_config_keys(tmp_path):
    from keyshot.infer.common.config import load_config
    from keyshot.train.train_config import TrainConfig

    path = tmp_path / "train.yaml"
    path.write_text("model:\n  padding_free: true\n")
    config = load_config(
        TrainConfig,
        path,
        [
            "model.compile=inductor",
            "model.vision_attention=varlen",
            "model.checkpoint_every=2",
            "model.liger_kernel=true",
        ],
    )
    model = config.model
    assert (
        model.padding_free,
        model.compile,
        model.vision_attention,
        model.checkpoint_every,
        model.liger_kernel,
    ) == (
        True,
        "inductor",
        "varlen",
        2,
        True,
    )
    with pytest.raises(ConfigError):
        load_config(TrainConfig, path, ["model.vision_attention=gathers"])


# ------------------------------------------------------------------------------------------------ checkpoint_every
def test_checkpoint_every_second_layer_gives_the_same_step(tiny_model_dir, batch):
    every = prepare_seeded(
        load_tiny(tiny_model_dir),
        tiny_settings(tiny_model_dir, gradient_checkpointing=True, checkpoint_every=2),
    )
    layers = every.model.language_model.layers
    assert [layer.gradient_checkpointing for layer in layers] == [True, False]
    reference = prepare_seeded(
        load_tiny(tiny_model_dir), tiny_settings(tiny_model_dir, gradient_checkpointing=True)
    )
    assert all(layer.gradient_checkpointing for layer in reference.model.language_model.layers)
    _assert_same_step(_step(every, batch), _step(reference, batch), 1e-5)


def test_checkpoint_every_without_checkpointing_changes_nothing_and_lora_keeps_it(tiny_model_dir):
    plain = prepare_seeded(load_tiny(tiny_model_dir), tiny_settings(tiny_model_dir, checkpoint_every=2))
    assert not any(layer.gradient_checkpointing for layer in plain.model.language_model.layers)
    lora = prepare_seeded(
        load_tiny(tiny_model_dir),
        tiny_settings(
            tiny_model_dir,
            gradient_checkpointing=True,
            checkpoint_every=2,
            lora=LoraSettings(enabled=True, r=4),
        ),
    )
    layers = lora.get_base_model().model.language_model.layers
    assert [layer.gradient_checkpointing for layer in layers] == [True, False]


# ------------------------------------------------------------------------------------------------ padding_free
@pytest.mark.parametrize("lora", [False, True])
def test_right_padded_batches_drop_their_mask_and_keep_the_loss(tiny_model_dir, batch, lora):
    def run(**switch):
        settings = tiny_settings(tiny_model_dir, lora=LoraSettings(enabled=lora, r=4), **switch)
        model = prepare_seeded(load_tiny(tiny_model_dir), settings)
        masks = []
        base = model.get_base_model() if lora else model
        base.model.language_model.register_forward_pre_hook(
            lambda _m, args, kwargs: masks.append(kwargs.get("attention_mask")), with_kwargs=True
        )
        return _step(model, batch), masks

    got, masks = run(padding_free=True)
    assert masks == [None]  # the language model ran without a padding mask
    want, reference_masks = run()
    assert reference_masks[0] is not None
    _assert_same_step(got, want, 1e-5)


def test_left_padding_keeps_its_mask():
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    assert is_right_padded(right)
    assert not is_right_padded(torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    assert not is_right_padded(torch.tensor([[1, 0, 1, 1]]))


# ------------------------------------------------------------------------------------------------ compile
def test_regional_compile_with_the_other_cpu_switches_gives_the_same_step(tiny_model_dir, batch):
    """Each decoder layer and vision block compiled (aot_eager on the CPU: dynamo's and AOTAutograd's graphs
    without code generation; inductor is the gpu test below), together with padding_free and checkpointing
    every second layer: the switches compose."""
    torch._dynamo.reset()
    switches = {"gradient_checkpointing": True, "checkpoint_every": 2, "padding_free": True}
    model = prepare_seeded(
        load_tiny(tiny_model_dir), tiny_settings(tiny_model_dir, compile="aot_eager", **switches)
    )
    assert all(layer._compiled_call_impl is not None for layer in model.model.language_model.layers)
    assert all(block._compiled_call_impl is not None for block in model.model.visual.blocks)
    reference = prepare_seeded(
        load_tiny(tiny_model_dir), tiny_settings(tiny_model_dir, gradient_checkpointing=True)
    )
    assert model.state_dict().keys() == reference.state_dict().keys()  # checkpoints are unchanged
    _assert_same_step(_step(model, batch), _step(reference, batch), 1e-5)


# ------------------------------------------------------------------------------------------------ CUDA-only switches
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
@pytest.mark.parametrize(
    ("switch", "message"),
    [
        ({"liger_kernel": True}, r"^model.liger_kernel=true needs liger-kernel with triton and a CUDA GPU"),
        ({"vision_attention": "varlen"}, r"^model.vision_attention=varlen needs a CUDA GPU"),
    ],
)
def test_cuda_switches_refuse_in_one_line_without_cuda(tiny_model_dir, switch, message):
    with pytest.raises(ModelSetupError, match=message) as caught:
        apply_speedups(load_tiny(tiny_model_dir), tiny_settings(tiny_model_dir, **switch))
    assert "\n" not in str(caught.value)


def test_liger_patches_the_language_model_only_and_the_tower_compiles_beside_it(tiny_model_dir):
    """Liger's kernels go to the language model's norms and MLPs alone (the tower's and the merger's norms
    stay transformers'), so with ``compile`` the tower's blocks compile and the decoder layers stay Liger's."""
    from keyshot.train.speedups import compile_layers, liger_targets

    model = load_tiny(tiny_model_dir)
    names = {id(m): n for n, m in model.named_modules()}
    norms, mlps = liger_targets(model)
    depth = model.config.get_text_config().num_hidden_layers
    assert len(norms) == 2 * depth + 1 and len(mlps) == depth
    assert all(names[id(m)].startswith("model.language_model.") for m in [*norms, *mlps])
    tower_norms = [
        n for n, m in model.named_modules() if type(m).__name__ == "Qwen2_5_VLRMSNorm" and "visual" in n
    ]
    assert tower_norms and not set(tower_norms) & {names[id(m)] for m in norms}
    assert compile_layers(model, "aot_eager", decoder=False).startswith("no decoder layer")
    assert all(block._compiled_call_impl is not None for block in model.model.visual.blocks)
    assert all(layer._compiled_call_impl is None for layer in model.model.language_model.layers)


def test_liger_applies_once_and_refuses_when_transformers_changed(tiny_model_dir, monkeypatch):
    """With stand-ins for Liger's kernels (they need CUDA): applied again, the same patch and the rotary's
    original kept; where this transformers has no class Liger patches, a one-line refusal, not a no-op."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    from keyshot.train import speedups

    class Kernel:
        def forward(self, x):
            return x

    def rope(q, k, cos, sin, unsqueeze_dim=1):
        return q, k

    monkeypatch.setattr(speedups, "_liger_modules", lambda: (Kernel, Kernel, rope))
    original = qwen.apply_rotary_pos_emb
    monkeypatch.setattr(qwen, "apply_rotary_pos_emb", original)  # put back after the test
    model = load_tiny(tiny_model_dir)
    line = speedups.use_liger_kernel(model)
    assert speedups.use_liger_kernel(model) == line  # again: the same modules, nothing wrapped twice
    assert qwen.apply_rotary_pos_emb._keyshot_original is original
    monkeypatch.delattr(qwen, "Qwen2_5_VLRMSNorm")
    with pytest.raises(ModelSetupError, match=r"^model.liger_kernel applied to 0 norms") as caught:
        speedups.use_liger_kernel(model)
    assert "\n" not in str(caught.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_liger_with_compile_is_no_longer_refused_as_a_pair(tiny_model_dir):
    """Where Liger cannot run, the line says why (no CUDA), not that the two switches do not compose."""
    settings = tiny_settings(tiny_model_dir, liger_kernel=True, compile="inductor")
    with pytest.raises(
        ModelSetupError, match=r"^model.liger_kernel=true needs liger-kernel with triton"
    ) as caught:
        apply_speedups(load_tiny(tiny_model_dir), settings)
    assert "\n" not in str(caught.value)


def test_varlen_patches_every_vision_attention_and_refuses_a_cpu_tower(tiny_model_dir):
    from keyshot.infer.model.vision_varlen import VarlenUnavailable, use_varlen_vision_attention

    model = load_tiny(tiny_model_dir)
    depth = model.config.vision_config.depth
    assert use_varlen_vision_attention(model) == depth
    assert use_varlen_vision_attention(model) == depth  # again: the same modules, replaced not wrapped
    pixels = torch.zeros(16, model.model.visual.patch_embed.proj.weight[0].numel())
    with pytest.raises(VarlenUnavailable, match="runs on CUDA in bfloat16/float16; the tower runs on cpu"):
        model.model.visual(pixels, grid_thw=torch.tensor([[1, 4, 4]]))
    # a model with no Qwen2.5-VL vision attention (a renamed class after an upgrade): said, not a silent no-op
    with pytest.raises(VarlenUnavailable, match="found no Qwen2_5_VLVisionAttention in Linear"):
        use_varlen_vision_attention(torch.nn.Linear(2, 2))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (torch's varlen_attn has no CPU kernel)"
)
@pytest.mark.parametrize("train_tower", [False, True])
def test_varlen_vision_attention_matches_transformers_on_cuda(tiny_model_dir, batch, train_tower):
    """bfloat16 (varlen_attn's dtypes): the step equals the batched windows' within bf16 rounding, with the
    tower frozen and trained (gradients through varlen_attn's backward)."""
    settings = tiny_settings(tiny_model_dir, dtype="bfloat16", train_vision_tower=train_tower)
    reference = prepare_seeded(load_tiny(tiny_model_dir, torch.bfloat16, "cuda"), settings)
    want = _step(reference, batch, "cuda")
    varlen = ModelSettings(**{**settings.__dict__, "vision_attention": "varlen"})
    model = prepare_seeded(load_tiny(tiny_model_dir, torch.bfloat16, "cuda"), varlen)
    assert apply_speedups(model, varlen) == ["vision_attention=varlen: 2 layers"]  # again: the same patch
    _assert_same_step(_step(model, batch, "cuda"), want, 3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Liger's kernels are Triton)")
@pytest.mark.parametrize("lora", [False, True])
def test_liger_kernel_matches_transformers_on_cuda(tiny_model_dir, batch, lora):
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (pip install 'keyshot[liger]')")
    settings = tiny_settings(tiny_model_dir, lora=LoraSettings(enabled=lora, r=4, dropout=0.0))
    reference = prepare_seeded(load_tiny(tiny_model_dir, device="cuda"), settings)
    want = _step(reference, batch, "cuda")
    liger = ModelSettings(**{**settings.__dict__, "liger_kernel": True})
    model = prepare_seeded(load_tiny(tiny_model_dir, device="cuda"), liger)
    applied = model.get_base_model() if lora else model
    text = applied.model.language_model
    assert type(text.norm).forward is not text.norm.forward.__func__  # patched on the instance
    _assert_same_step(_step(model, batch, "cuda"), want, 1e-4)
    # the rotary patch is the modeling module's function: CPU tensors still get transformers' own
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    q, k, cos, sin = (
        torch.randn(1, 2, 5, 32),
        torch.randn(1, 1, 5, 32),
        torch.randn(1, 5, 32),
        torch.randn(1, 5, 32),
    )
    original = qwen.apply_rotary_pos_emb._keyshot_original
    for got, want_t in zip(qwen.apply_rotary_pos_emb(q, k, cos, sin), original(q, k, cos, sin), strict=True):
        assert torch.equal(got, want_t)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (inductor's Triton kernels)")
def test_regional_compile_with_inductor_on_cuda(tiny_model_dir, batch):
    torch._dynamo.reset()
    settings = tiny_settings(tiny_model_dir, gradient_checkpointing=True, checkpoint_every=2)
    model = prepare_seeded(
        load_tiny(tiny_model_dir, device="cuda"),
        ModelSettings(**{**settings.__dict__, "compile": "inductor"}),
    )
    reference = prepare_seeded(load_tiny(tiny_model_dir, device="cuda"), settings)
    _assert_same_step(_step(model, batch, "cuda"), _step(reference, batch, "cuda"), 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Liger's kernels, inductor)")
def test_liger_with_the_tower_compiled_on_cuda(tiny_model_dir, batch):
    """Liger on the language model, inductor on the tower's blocks: transformers' step within rounding."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (pip install 'keyshot[liger]')")
    torch._dynamo.reset()
    settings = tiny_settings(tiny_model_dir, gradient_checkpointing=True, train_vision_tower=True)
    reference = prepare_seeded(load_tiny(tiny_model_dir, device="cuda"), settings)
    want = _step(reference, batch, "cuda")
    both = ModelSettings(**{**settings.__dict__, "liger_kernel": True, "compile": "inductor"})
    model = prepare_seeded(load_tiny(tiny_model_dir, device="cuda"), both)
    assert all(block._compiled_call_impl is not None for block in model.model.visual.blocks)
    assert all(layer._compiled_call_impl is None for layer in model.model.language_model.layers)
    _assert_same_step(_step(model, batch, "cuda"), want, 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_switch_at_once_on_cuda(tiny_model_dir, batch):
    """The switches of the shipped 7B LoRA config, with the fused adapters, on a bf16 LoRA model as the 7B
    would train: transformers' step within bf16 rounding."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (pip install 'keyshot[liger]')")
    torch._dynamo.reset()
    lora = LoraSettings(enabled=True, r=4, dropout=0.0)
    settings = tiny_settings(tiny_model_dir, dtype="bfloat16", gradient_checkpointing=True, lora=lora)
    reference = prepare_seeded(load_tiny(tiny_model_dir, torch.bfloat16, "cuda"), settings)
    want = _step(reference, batch, "cuda")
    switches = {"liger_kernel": True, "vision_attention": "varlen", "padding_free": True}
    fused = LoraSettings(enabled=True, r=4, dropout=0.0, fused=True)
    every = ModelSettings(**{**settings.__dict__, **switches, "checkpoint_every": 2, "lora": fused})
    model = prepare_seeded(load_tiny(tiny_model_dir, torch.bfloat16, "cuda"), every)
    _assert_same_step(_step(model, batch, "cuda"), want, 3e-2)
