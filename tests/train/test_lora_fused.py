"""``model.lora.fused`` (keyshot.train.lora_fused): the fused adapter forward gives peft's forward, input
gradient and adapter gradients within float32 rounding on the tiny model, with and without checkpointing;
the adapters save, load and merge as peft's; the patch applies once and refuses what it cannot fuse."""

from __future__ import annotations

import pytest
import torch

from keyshot.infer.common.config import ConfigError
from keyshot.train.lora_fused import fused_layers, use_fused_lora
from keyshot.train.scorer_model import ModelSetupError
from keyshot.train.train_config import LoraSettings
from tests.support.tiny_model import load_tiny, prepare_seeded, tiny_settings


def _lora_model(tiny_model_dir, *, fused: bool, checkpointing: bool = False):
    settings = tiny_settings(
        tiny_model_dir,
        gradient_checkpointing=checkpointing,
        lora=LoraSettings(enabled=True, r=4, alpha=8, fused=fused),
    )
    model = prepare_seeded(load_tiny(tiny_model_dir), settings)
    generator = torch.Generator().manual_seed(1)  # B starts at zero: give it values, the same in both models
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
    return model


def _step_with_input_grad(model, batch):
    """Loss, labelled logits, the adapters' gradients and the gradient at the language model's input."""
    model.train()
    model.zero_grad(set_to_none=True)
    seen: list[torch.Tensor] = []

    def keep(_module, _args, out):
        out.requires_grad_(True)
        out.retain_grad()
        seen.append(out)

    embed = model.get_base_model().model.language_model.embed_tokens
    handle = embed.register_forward_hook(keep)
    try:
        out = model(**batch)
        out.loss.backward()
    finally:
        handle.remove()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    keep_mask = batch["labels"] != -100
    return out.loss.detach(), out.logits.detach()[keep_mask], grads, seen[0].grad.detach().clone()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fused_adapters_equal_peft_in_float32(tiny_model_dir, batch, checkpointing):
    fused = _lora_model(tiny_model_dir, fused=True, checkpointing=checkpointing)
    reference = _lora_model(tiny_model_dir, fused=False, checkpointing=checkpointing)
    kinds: list[str] = []
    attention = fused.get_base_model().model.language_model.layers[0].self_attn
    attention.k_proj.register_forward_hook(lambda _m, _a, out: kinds.append(type(out.grad_fn).__name__))
    got, want = _step_with_input_grad(fused, batch), _step_with_input_grad(reference, batch)
    assert kinds and all("FusedLoraGroup" in k for k in kinds)  # the fused product ran, not peft's
    loss, logits, grads, input_grad = got
    want_loss, want_logits, want_grads, want_input_grad = want
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(input_grad, want_input_grad, rtol=1e-5, atol=1e-5)
    assert grads.keys() == want_grads.keys() and all("lora_" in n for n in grads)
    assert {n.split(".lora_")[0].rsplit(".", 1)[1] for n in grads} >= {
        "q_proj",
        "k_proj",
        "v_proj",
        "down_proj",
    }
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], rtol=1e-5, atol=1e-5, msg=name)
        assert grads[name].abs().max() > 0, name


def test_shared_inputs_share_one_adapter_product_and_the_patch_applies_once(tiny_model_dir):
    model = _lora_model(tiny_model_dir, fused=True)
    layers = model.get_base_model().model.language_model.layers
    depth = len(layers)
    attention, mlp = layers[0].self_attn, layers[0].mlp
    assert attention.q_proj._keyshot_lora_group is attention.v_proj._keyshot_lora_group
    assert len(attention.q_proj._keyshot_lora_group.members) == 3
    assert len(mlp.gate_proj._keyshot_lora_group.members) == 2
    assert (
        len(mlp.down_proj._keyshot_lora_group.members)
        == len(attention.o_proj._keyshot_lora_group.members)
        == 1
    )
    forwards = {id(m): m.forward for m in model.modules() if "_keyshot_lora_group" in m.__dict__}
    assert fused_layers(model) == 7 * depth == use_fused_lora(model)  # again: nothing new
    assert {id(m): m.forward for m in model.modules() if "_keyshot_lora_group" in m.__dict__} == forwards


def test_fused_adapters_save_load_and_merge_as_peft_does(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from keyshot.train.adapter_merge import merge_adapter

    fused = _lora_model(tiny_model_dir, fused=True).eval()
    reference = _lora_model(tiny_model_dir, fused=False)
    assert fused.state_dict().keys() == reference.state_dict().keys()  # peft's own parameters, nothing added
    ids = torch.tensor([[11, 12, 13, 14, 15, 16]])
    with torch.no_grad():
        want = fused(input_ids=ids).logits
    fused.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        loaded = PeftModel.from_pretrained(load_tiny(tiny_model_dir), str(tmp_path / "adapter"))
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
        merged = merge_adapter(
            tmp_path / "adapter",
            tmp_path / "merged",
            base=str(tiny_model_dir),
            prompt_variant="online_mind2web",
        )
        served = AutoModelForImageTextToText.from_pretrained(merged)(input_ids=ids).logits
        torch.testing.assert_close(served, want, rtol=1e-5, atol=1e-5)
        # merged in place, a layer runs peft's path (a fused forward would add the adapter a second time)
        fused.merge_adapter()
        torch.testing.assert_close(fused(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
        fused.unmerge_adapter()
        torch.testing.assert_close(fused(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused.merge_and_unload()(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)


def test_under_autocast_the_fused_products_run_in_its_dtype(tiny_model_dir, batch):
    """The recipe's bf16 autocast (here on the CPU): the fused layers compute in bf16 from float32 adapters,
    as peft's layers do under autocast, and give its loss within bf16 rounding."""
    fused = _lora_model(tiny_model_dir, fused=True)
    reference = _lora_model(tiny_model_dir, fused=False)
    dtypes: list[torch.dtype] = []
    fused.get_base_model().model.language_model.layers[0].mlp.up_proj.register_forward_hook(
        lambda _m, _a, out: dtypes.append((out.dtype, type(out.grad_fn).__name__))
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = fused(**batch).loss, reference(**batch).loss
    assert dtypes == [(torch.bfloat16, "_FusedLoraGroupBackward")]
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)


def test_a_layer_whose_weights_zero3_shards_runs_peft_s_forward(tiny_model_dir):
    """ZeRO-3 gathers a module's weights around its own forward, which the fused product does not call: such
    a group takes peft's path (a ``ds_id`` marks a partitioned parameter, as DeepSpeed sets it)."""
    model = _lora_model(tiny_model_dir, fused=True)
    attention = model.get_base_model().model.language_model.layers[0].self_attn
    kinds: list[str] = []
    for name in ("q_proj", "o_proj"):
        getattr(attention, name).register_forward_hook(
            lambda _m, _a, out: kinds.append(type(out.grad_fn).__name__)
        )
    attention.k_proj.base_layer.weight.ds_id = 0
    model(input_ids=torch.tensor([[11, 12, 13, 14]]))
    assert "FusedLoraGroup" not in kinds[0] and "FusedLoraGroup" in kinds[1]  # q/k/v: peft's; o: fused


def test_what_cannot_be_fused_is_refused_in_one_line(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"^model.lora.fused needs model.lora.dropout 0"):
        LoraSettings(enabled=True, dropout=0.05, fused=True)
    with pytest.raises(ModelSetupError, match=r"^model.lora.fused found no peft LoRA linear layer in Linear"):
        use_fused_lora(torch.nn.Linear(2, 2))
    model = _lora_model(tiny_model_dir, fused=False)
    layer = model.get_base_model().model.language_model.layers[0].self_attn.q_proj
    layer.lora_dropout["default"] = torch.nn.Dropout(0.1)
    with pytest.raises(
        ModelSetupError, match=r"cannot fuse .*q_proj: adapter 'default' has dropout"
    ) as caught:
        use_fused_lora(model)
    assert "\n" not in str(caught.value)
