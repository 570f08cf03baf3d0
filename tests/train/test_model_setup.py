"""Model set-up for training: freezing, LoRA targets, parameter groups, the FLOPs model, merge-lora."""

from __future__ import annotations

import pytest
import torch

from keyshot.train.scorer_model import (
    attention_implementation,
    count_parameters,
    load_scorer_model,
    parameter_groups,
)
from keyshot.train.throughput import FlopsModel, ThroughputMeter
from keyshot.train.train_config import LoraSettings, ModelSettings, OptimSettings
from tests.support.tiny_model import FLOPS_ARGS


def _settings(tiny_model_dir, **kw) -> ModelSettings:
    return ModelSettings(name_or_path=str(tiny_model_dir), dtype="float32", attn_implementation="sdpa", **kw)


def test_vision_tower_frozen_merger_and_llm_trained(tiny_model_dir):
    model = load_scorer_model(_settings(tiny_model_dir))
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    assert not any(g for n, g in grads.items() if "visual." in n and "merger" not in n)
    assert all(g for n, g in grads.items() if "visual.merger." in n)
    assert all(g for n, g in grads.items() if "language_model." in n or n.startswith("lm_head"))
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    counts = count_parameters(model)
    assert (
        counts.trainable == counts.merger + counts.llm
        and counts.total == counts.vision + counts.merger + counts.llm
    )
    groups = parameter_groups(model, OptimSettings(lr=1e-4, weight_decay=0.1), vision_lr_scale=0.1)
    assert {g["name"] for g in groups} == {"main", "main_no_decay"}
    no_decay = next(g for g in groups if g["name"] == "main_no_decay")
    assert no_decay["weight_decay"] == 0.0 and all(p.ndim == 1 for p in no_decay["params"])


def test_training_the_vision_tower_uses_a_lower_rate(tiny_model_dir):
    model = load_scorer_model(
        _settings(tiny_model_dir, train_vision_tower=True, gradient_checkpointing=False)
    )
    assert all(p.requires_grad for p in model.parameters())
    groups = {g["name"]: g for g in parameter_groups(model, OptimSettings(lr=1e-4), vision_lr_scale=0.1)}
    assert groups["vision"]["lr"] == pytest.approx(1e-5) and groups["main"]["lr"] == pytest.approx(1e-4)
    vision_ids = {id(p) for n, p in model.named_parameters() if "visual." in n and "merger" not in n}
    assert {id(p) for p in groups["vision"]["params"] + groups["vision_no_decay"]["params"]} == vision_ids


def test_lora_adapts_the_language_model_only(tiny_model_dir):
    model = load_scorer_model(_settings(tiny_model_dir, lora=LoraSettings(enabled=True, r=4, alpha=8)))
    adapted = [n for n, _ in model.named_modules() if n.endswith("lora_A")]
    assert adapted and all("language_model" in n for n in adapted)
    kinds = {n.split(".")[-2] for n in adapted}
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # gradient checkpointing with frozen embeddings still lets gradients reach the adapters
    ids = torch.tensor([[5, 6, 7, 8]])
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


def test_attention_kernel_choice():
    assert attention_implementation("auto") == "sdpa"  # no GPU / flash-attn here
    assert attention_implementation("eager") == "eager"


def test_flops_model_counts_what_runs(tiny_model_dir):
    model = load_scorer_model(_settings(tiny_model_dir))
    full = FlopsModel.from_model(model, lora=False, train_vision=False)
    text = (64, 2)  # hidden, layers of the tiny model
    assert (full.llm_hidden, full.llm_layers) == text
    # one sequence of 100 tokens with one 240-patch image, by hand
    assert full.head_params == model.lm_head.weight.numel() == 64 * model.config.get_text_config().vocab_size
    expected_llm = 3 * (2 * full.llm_params * 100 + 2 * full.head_params * 100 + 4 * 2 * 64 * 100 * 100)
    window = full.vision_layers - full.vision_full_layers
    attn = 4 * 64 * (full.vision_full_layers * 240 * 240 + window * 240 * min(240, full.window_patches))
    expected_vision = 1 * (2 * full.vision_params * 240 + attn)
    expected_merger = 3 * 2 * full.merger_params * 240 / 4
    assert full.batch_flops([100], [240]) == pytest.approx(expected_llm + expected_vision + expected_merger)
    lora = FlopsModel(**{**full.__dict__, "llm_factor": 2.0, "merger_factor": 1.0})
    assert lora.batch_flops([100], [240]) < full.batch_flops([100], [240])
    # the head only where logits are needed: 5 answer tokens of 100
    assert full.batch_flops([100], [240], head_tokens=5) == pytest.approx(
        expected_llm + expected_vision + expected_merger - 3 * 2 * full.head_params * 95
    )
    # the hardware's count adds the decoder's recompute under checkpointing; a frozen tower recomputes nothing
    hw = full.with_recompute(1.0)
    assert (hw.llm_factor, hw.vision_factor, hw.merger_factor) == (4.0, 1.0, 3.0)
    assert full.with_recompute(0.5).llm_factor == 3.5 and full.with_recompute(0.0) is full
    meter = ThroughputMeter(full, peak_tflops_per_device=1.0, world_size=2)
    batch = {
        "attention_mask": torch.tensor([[1] * 100, [1] * 60 + [0] * 40]),
        "image_grid_thw": torch.tensor([[1, 12, 20], [1, 12, 20]]),
    }
    meter.add_batch(batch)
    totals = meter.local_totals()
    assert totals[:3].tolist() == [2, 160, 200]
    assert totals[3].item() == pytest.approx(full.batch_flops([100, 60], [240, 240]))
    labels = torch.full((2, 100), -100)
    labels[0, 90:95] = 1
    labels[1, 50:53] = 1
    meter.add_batch({**batch, "labels": labels})  # a labelled batch counts the head on 8 positions
    assert meter.local_totals()[3].item() == pytest.approx(
        2 * full.batch_flops([100, 60], [240, 240]) - 3 * 2 * full.head_params * (160 - 8)
    )
    meter.reset()
    meter.add_batch(batch)
    report = meter.report()
    assert report["padding_fraction"] == pytest.approx(0.2)
    assert report["mfu"] == pytest.approx(report["tflops_per_s"] / 2.0)


def test_log_totals_meet_on_the_model_device():
    """The losses live on the model's device and the meter counts on the host: the logging step must
    bring both to the device before concatenating (on CUDA, today's torch.cat of the two raised)."""
    from keyshot.train.throughput import log_totals

    full = FlopsModel(**FLOPS_ARGS)
    meter = ThroughputMeter(full, peak_tflops_per_device=1.0, world_size=1)
    meter.add_batch(
        {"attention_mask": torch.ones(1, 10, dtype=torch.long), "image_grid_thw": torch.tensor([[1, 4, 4]])}
    )
    # "meta" stands in for a CUDA device here: mixing it with a CPU tensor fails the same way
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.cat([torch.zeros(1, dtype=torch.float64, device="meta"), meter.local_totals()])
    losses = [torch.tensor(2.0, device="meta"), torch.tensor(4.0, device="meta")]
    stats = log_totals(losses, meter, "meta")
    assert stats.device.type == "meta" and stats.shape == (5,)
    cpu = log_totals([torch.tensor(2.0), torch.tensor(4.0)], meter, "cpu")
    assert cpu[0].item() == 3.0 and cpu[1:3].tolist() == [1, 10]


def test_lora_keeps_bf16_activations_under_autocast_and_float32_adapters(tiny_model_dir):
    """Under the recipe's autocast a LoRA layer's input is not copied to float32 (the H200 finding), the
    adapters stay float32 and get gradients, and the loss is peft's own within bf16 rounding; outside
    autocast peft's cast still applies (a bf16 model with float32 adapters runs)."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    settings = ModelSettings(
        name_or_path=str(tiny_model_dir),
        dtype="bfloat16",
        attn_implementation="sdpa",
        lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0),
    )
    model = load_scorer_model(settings)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)
    seen: list[torch.dtype] = []
    layer = next(m for m in model.modules() if isinstance(m, LoraLinear))
    handle = next(iter(layer.lora_A.values())).register_forward_pre_hook(
        lambda _m, a: seen.append(a[0].dtype)
    )
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert seen and set(seen) == {torch.bfloat16}  # peft alone would have cast it to float32
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and g.dtype == torch.float32 for g in grads)
    handle.remove()
    for module in model.modules():  # peft's own cast, for the reference loss
        module.__dict__.pop("_cast_input_dtype", None)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss.detach().float(), reference.float(), rtol=2e-2, atol=2e-2)
    with torch.no_grad():  # no autocast: the input is cast to the adapters' float32 as peft does
        assert torch.isfinite(load_scorer_model(settings)(input_ids=ids, labels=ids).loss)
