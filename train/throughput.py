"""Training throughput: samples/s, tokens/s and an MFU estimate for Qwen2.5-VL.

FLOPs per optimizer step, counted from the batches actually run (padding excluded):

* language model: ``2·N`` per token forward (N = non-embedding parameters of the decoder) plus attention
  ``4·L·d·s`` per token of a length-``s`` sequence (PaLM's convention, no causal discount), and the LM
  head's ``2·N_head`` only on the tokens whose logits are needed (the labelled answer while training: the
  loss reads nothing else; one position per request when scoring);
* vision encoder: ``2·N_vis`` per 14×14 patch plus attention over the image (full-attention blocks)
  or over a window (windowed blocks); the merger ``2·N_merger`` per merged token.

Backward costs twice the forward where gradients flow: the language model ×3 for a full
fine-tune; ×2 with LoRA (input gradients only); the vision tower ×1 when frozen (no backward)
and ×3 when trained. MFU = achieved FLOP/s ÷ (peak FLOP/s per device × devices). Gradient
checkpointing's recompute is not counted there; :meth:`FlopsModel.with_recompute` counts it (the
hardware FLOPs utilisation, HFU: what the device actually ran).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch


def _numel(p) -> int:
    return int(getattr(p, "ds_numel", 0) or p.numel())


@dataclass(frozen=True)
class FlopsModel:
    llm_params: int  # decoder layers and final norm (the LM head is ``head_params``)
    llm_layers: int
    llm_hidden: int
    vision_params: int
    vision_layers: int
    vision_full_layers: int
    vision_hidden: int
    window_patches: int
    merger_params: int
    merge_unit: int
    llm_factor: float  # 3 full fine-tune, 2 LoRA
    vision_factor: float  # 1 frozen, 3 trained
    merger_factor: float
    head_params: int = 0  # lm_head: vocab × hidden, run only where logits are needed

    @classmethod
    def from_model(cls, model, *, lora: bool, train_vision: bool) -> FlopsModel:
        config = model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config.text_config
        vision = config.vision_config
        llm = vis = merger = head = 0
        for name, p in model.named_parameters():
            if "lora_" in name or "embed_tokens" in name:
                continue
            if "lm_head." in name:
                head += _numel(p)
            elif "visual.merger." in name:
                merger += _numel(p)
            elif "visual." in name:
                vis += _numel(p)
            else:
                llm += _numel(p)  # decoder layers, final norm, lm_head
        patch = vision.patch_size
        window = (getattr(vision, "window_size", 0) // patch) ** 2 or 0
        full_layers = len(getattr(vision, "fullatt_block_indexes", None) or []) if window else vision.depth
        if not head and getattr(config, "tie_word_embeddings", False):  # tied: the embedding is the head
            head = text.vocab_size * text.hidden_size
        return cls(
            llm_params=llm,
            llm_layers=text.num_hidden_layers,
            llm_hidden=text.hidden_size,
            vision_params=vis,
            vision_layers=vision.depth,
            vision_full_layers=full_layers,
            vision_hidden=vision.hidden_size,
            window_patches=window,
            merger_params=merger,
            merge_unit=vision.spatial_merge_size**2,
            llm_factor=2.0 if lora else 3.0,
            vision_factor=3.0 if train_vision and not lora else 1.0,
            merger_factor=1.0 if lora else 3.0,
            head_params=head,
        )

    def with_recompute(self, checkpointed: float) -> FlopsModel:
        """The hardware's count: activation checkpointing runs each checkpointed decoder layer's forward
        again in the backward (``checkpointed``: the share of decoder layers checkpointed, 0 to 1), and the
        tower's blocks when it trains; a frozen tower records nothing to recompute."""
        if not checkpointed:
            return self
        return dataclasses.replace(
            self,
            llm_factor=self.llm_factor + checkpointed,
            vision_factor=self.vision_factor + (checkpointed if self.vision_factor > 1.0 else 0.0),
        )

    def batch_flops(
        self, seq_lengths: list[int], image_patches: list[int], head_tokens: int | None = None
    ) -> float:
        """Training FLOPs of one micro-batch: per-sequence real lengths, per-image patch counts, and the
        tokens whose logits are needed (``None``: every token)."""
        tokens = sum(seq_lengths)
        head_tokens = tokens if head_tokens is None else head_tokens
        llm = (
            2.0 * self.llm_params * tokens
            + 2.0 * self.head_params * head_tokens
            + 4.0 * self.llm_layers * self.llm_hidden * sum(s * s for s in seq_lengths)
        )
        patches = sum(image_patches)
        window_layers = self.vision_layers - self.vision_full_layers
        attn = sum(
            4.0
            * self.vision_hidden
            * (self.vision_full_layers * n * n + window_layers * n * min(n, self.window_patches))
            for n in image_patches
        )
        vision = 2.0 * self.vision_params * patches + attn
        merger = 2.0 * self.merger_params * patches / self.merge_unit
        return self.llm_factor * llm + self.vision_factor * vision + self.merger_factor * merger


def batch_shape_stats(batch: dict[str, torch.Tensor]) -> tuple[list[int], list[int], int]:
    """(real sequence lengths, patches per image, padded token slots) of a collated batch."""
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    grid = batch["image_grid_thw"]
    patches = (grid[:, 0] * grid[:, 1] * grid[:, 2]).tolist()
    return lengths, patches, int(batch["attention_mask"].numel())


def labelled_tokens(batch: dict[str, torch.Tensor]) -> int | None:
    """How many positions the loss reads (labels other than -100, shifted by one), or None unlabelled."""
    labels = batch.get("labels")
    return None if labels is None else int((labels[:, 1:] != -100).sum())


class ThroughputMeter:
    """Counts work between two reports; ``report`` turns the (all-rank) totals into rates and MFU."""

    def __init__(self, flops_model: FlopsModel, peak_tflops_per_device: float, world_size: int):
        self.flops_model = flops_model
        self.peak = peak_tflops_per_device * 1e12 * world_size
        self.world_size = world_size
        self.reset()

    def reset(self) -> None:
        self.samples = 0
        self.tokens = 0
        self.slots = 0
        self.flops = 0.0
        self.started = time.perf_counter()

    def add_batch(self, batch: dict[str, torch.Tensor]) -> None:
        lengths, patches, slots = batch_shape_stats(batch)
        self.samples += len(lengths)
        self.tokens += sum(lengths)
        self.slots += slots
        self.flops += self.flops_model.batch_flops(lengths, patches, labelled_tokens(batch))

    def local_totals(self, device: torch.device | str | None = None) -> torch.Tensor:
        return torch.tensor(
            [self.samples, self.tokens, self.slots, self.flops], dtype=torch.float64, device=device
        )

    def report(self, totals: torch.Tensor | None = None) -> dict[str, float]:
        """Rates since the last reset; ``totals`` are the summed :meth:`local_totals` of all ranks."""
        samples, tokens, slots, flops = (totals if totals is not None else self.local_totals()).tolist()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        out = {
            "samples_per_s": samples / elapsed,
            "tokens_per_s": tokens / elapsed,
            "padding_fraction": 1.0 - tokens / slots if slots else 0.0,
            "tflops_per_s": flops / elapsed / 1e12,
            "mfu": flops / elapsed / self.peak if self.peak > 0 else 0.0,
        }
        self.reset()
        return out


def log_totals(
    losses: list[torch.Tensor], meter: ThroughputMeter, device: torch.device | str
) -> torch.Tensor:
    """``[mean loss, samples, tokens, slots, flops]`` of this rank, on ``device``, ready to all-reduce.

    The losses live where the model runs (a GPU) and the meter counts on the host: both are moved to
    ``device`` before they meet (concatenating a CUDA and a CPU tensor raises).
    """
    mean_loss = torch.stack([loss.to(device) for loss in losses]).mean().reshape(1).double()
    return torch.cat([mean_loss, meter.local_totals(device)])
