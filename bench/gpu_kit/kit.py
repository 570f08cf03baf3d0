"""The kit's machine and model: the device's bf16 peak, the versions, the 7B (or tiny) shape built with
random weights on the device, the screenshots and request the scorer rows use, a forward's FLOPs."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import platform
import random
from pathlib import Path

import torch

from bench.record import REPO
from keyshot.infer.protocol.images import DEFAULT_POLICY, prepare_image
from keyshot.train.throughput import FlopsModel

SHAPE_7B = REPO / "configs" / "models" / "qwen2.5-vl-7b.json"


# Dense bf16 peak TFLOP/s by device name (first match wins): the vendors' data sheets, no sparsity.
# The NVL (PCIe-card) parts run at lower clocks than the SXM modules whose plain names they extend, so
# they come first: "NVIDIA H200 NVL" is 835, "NVIDIA H200" (SXM) 989.
PEAK_BF16_TFLOPS = [
    ("H200 NVL", 835.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("A10G", 125.0),
]


# Online-Mind2Web screenshot sizes: mostly 1280×720, then 1080p, laptop, phone and a tall page.
SIZES = [(1280, 720)] * 6 + [(1920, 1080), (1366, 768), (390, 844), (1280, 2400)]


TASK = "Find a one-way flight from New York to London on the 3rd of next month under $600"


KEY_POINTS = "\n1. One-way\n2. New York to London\n3. The 3rd of next month\n4. Under $600"


# ----------------------------------------------------------------------------- the set-up
@dataclasses.dataclass
class Kit:
    device: torch.device
    dtype: torch.dtype
    shape: str
    processor: object
    fixture: Path
    peak_tflops: float
    peak_source: str

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def mixed_precision(self) -> str:
        """The shipped 7B configs' ``mixed_precision`` on a GPU (bf16 autocast); the tiny shape's float32 elsewhere."""
        return "bf16" if self.device.type == "cuda" else "no"


def device_peak(device: torch.device, cpu_peak: float) -> tuple[float, str]:
    if device.type != "cuda":
        return cpu_peak, f"--cpu-peak {cpu_peak:g} (a nominal CPU figure, not a data sheet)"
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16_TFLOPS:
        if key in name:
            return peak, f"{key} dense bf16 data sheet"
    raise SystemExit(f"bench/gpu.py: no bf16 peak known for {name!r}; pass --peak TFLOPS")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "peft", "accelerate", "liger-kernel", "triton", "flash-attn", "vllm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["cuda"] = torch.version.cuda or "none"
    return out


def model_config(kit: Kit, depth: int | None = None):
    """The shape's config with the fixture tokenizer's special ids (and ``depth`` decoder layers)."""
    from transformers import AutoConfig, Qwen2_5_VLConfig

    if kit.shape == "tiny":
        config = AutoConfig.from_pretrained(kit.fixture)
    else:
        data = {k: v for k, v in json.loads(SHAPE_7B.read_text()).items() if not k.startswith("_")}
        config = Qwen2_5_VLConfig(**data)
        tok = kit.processor.tokenizer
        ids = {
            t: tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>")
        }
        config.image_token_id = ids["<|image_pad|>"]
        config.video_token_id = ids["<|video_pad|>"]
        config.vision_start_token_id = ids["<|vision_start|>"]
        config.vision_end_token_id = tok.convert_tokens_to_ids("<|vision_end|>")
        text = config.get_text_config()
        text.bos_token_id = text.pad_token_id = tok.pad_token_id
        text.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    if depth is not None:
        text = config.get_text_config()
        text.num_hidden_layers = text.max_window_layers = depth
        if getattr(text, "layer_types", None):
            text.layer_types = text.layer_types[:depth]
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return config


def build_model(kit: Kit, depth: int | None = None):
    """Random weights created on the device, in the kit's dtype."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from keyshot.train.scorer_model import attention_implementation

    torch.manual_seed(0)
    config = model_config(kit, depth)
    with torch.device(kit.device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(
            config, dtype=kit.dtype, attn_implementation=attention_implementation("auto")
        )
    return model


# ----------------------------------------------------------------------------- scoring
def screenshots(n: int) -> list:
    from keyshot.infer.testing.scorer_data import screenshot

    rng = random.Random(0)
    return [
        prepare_image(screenshot(rng.choice([1, 3, 5]), (1280, 720), rng), DEFAULT_POLICY) for _ in range(n)
    ]


def forward_counts(kit: Kit) -> FlopsModel:
    """Forward-only FLOP counts of the shape (every factor 1), from the model built on the meta device."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(model_config(kit), dtype=kit.dtype)
    counts = FlopsModel.from_model(model, lora=False, train_vision=False)
    return dataclasses.replace(counts, llm_factor=1.0, vision_factor=1.0, merger_factor=1.0)


def forward_flops(kit: Kit, seq_len: int, patches: int) -> float:
    """Forward FLOPs of one scorer request: the LM head on the one position it keeps (``logits_to_keep=1``)."""
    return forward_counts(kit).batch_flops([seq_len], [patches], head_tokens=1)
