"""A tiny, randomly initialised Qwen2.5-VL built offline, for tests, CI and the CPU demo.

It has the real architecture and files (config, safetensors weights, a byte-level BPE tokenizer
with the Qwen special tokens at the end of the vocabulary, the Qwen2.5-VL chat template, the
image processor with small pixel bounds, a greedy generation config), so every code path that
loads ``Qwen/Qwen2.5-VL-7B-Instruct`` loads it the same way, and vLLM serves it. Its answers are
noise until trained. Shapes respect vLLM's CPU kernels: text head_dim 32 with
``sum(mrope_section) == head_dim / 2``, and a vision window that is a multiple of patch × merge.

    python -m keyshot.infer.model.tiny_model OUT_DIR [--seed 0] [--max-pixels 50176]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
PLAIN_ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
# Qwen2's pre-tokenizer split: contractions, letter runs, single digits, punctuation, newlines, spaces.
SPLIT_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# The Qwen2.5-VL-Instruct chat template: default system turn, image/video placeholders, optional
# "Picture N:" ids, generation prompt.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TINY_MIN_PIXELS = 4 * 28 * 28
TINY_MAX_PIXELS = 64 * 28 * 28  # a 1280×720 screenshot becomes 60 visual tokens


def _corpus(seed: int):
    """Training text for the BPE: the WebJudge prompts (so prompts tokenise compactly) and web words."""
    from keyshot.infer.protocol.prompts import VARIANTS, load_prompt_set

    for variant in VARIANTS:
        for _, text in load_prompt_set(variant).strings:
            yield from [text] * 20
    rng = random.Random(seed)
    words = (
        "search click type select scroll order filter sort price cart checkout login page button menu "
        "results item list form submit the a of to in for on with and is not shows screenshot task key points "
        "Reasoning Score Status Thoughts success failure goal step action URL http www com 0 1 2 3 4 5 6 7 8 9"
    ).split()
    for _ in range(3000):
        yield " ".join(rng.choice(words) for _ in range(rng.randint(3, 16)))
    for n in range(1, 6):
        yield f"**Reasoning**: the page shows the task.\n\n**Score**: {n}"


def _build_tokenizer(vocab: int, seed: int):
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    return tok


@contextlib.contextmanager
def _deepspeed_on_cpu():
    """``DS_ACCELERATOR=cpu`` while the block runs, then the environment as it was.

    Saving imports DeepSpeed where it is installed, which, without a GPU, warns that it "falls back" to the
    CPU: this model is a CPU model, so the save says so. Only where nobody chose an accelerator and no GPU is
    present: DeepSpeed keeps the accelerator it first finds for the whole process, and a CUDA run (a test,
    bench/gpu.py) that builds the tiny model must still find CUDA afterwards."""
    import torch

    if "DS_ACCELERATOR" in os.environ or torch.cuda.is_available():
        yield
        return
    os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        yield
    finally:
        os.environ.pop("DS_ACCELERATOR", None)


def build_tiny_qwen25vl(
    out_dir: str | Path,
    seed: int = 0,
    min_pixels: int = TINY_MIN_PIXELS,
    max_pixels: int = TINY_MAX_PIXELS,
    dtype: str = "float32",
    bpe_vocab: int = 2000,
    hidden_size: int = 64,
    num_layers: int = 2,
) -> Path:
    """Write a tiny random Qwen2.5-VL checkpoint to ``out_dir`` and return the folder.

    Deterministic for a given seed. The processor's pixel bounds are ``min_pixels``/``max_pixels``.
    """
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2Tokenizer,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )
    from transformers.utils import logging as hf_logging

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = Qwen2Tokenizer(
        tokenizer_object=_build_tokenizer(bpe_vocab, seed),
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        errors="replace",
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    vocab_size = -(-len(tokenizer) // 64) * 64
    head_dim = 32
    heads = hidden_size // head_dim
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 1,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6,
            "use_sliding_window": False,
            "max_window_layers": num_layers,
            "rope_parameters": {"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 1e6},
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 56,
            "out_hidden_size": hidden_size,
            "fullatt_block_indexes": [1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    model = Qwen2_5_VLForConditionalGeneration(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
        do_sample=False,
    )
    image_processor = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
    video_processor = Qwen2VLVideoProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    hf_logging.disable_progress_bar()  # no progress bar for one shard
    try:
        with _deepspeed_on_cpu():
            model.save_pretrained(out, safe_serialization=True)
    finally:
        hf_logging.enable_progress_bar()
    processor.save_pretrained(out)
    return out


def write_tiny_scorer_meta(folder: str | Path, variant: str = "online_mind2web") -> Path:
    """Make a tiny model folder a keyshot scorer checkpoint: ``keyshot.json`` with the prompt
    version and the tiny pixel bounds (what ``keyshot serve`` checks and passes to vLLM)."""
    from keyshot.infer.model.checkpoint import write_scorer_meta
    from keyshot.infer.protocol.images import ImagePolicy

    policy = ImagePolicy(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    return write_scorer_meta(folder, policy, base_model="tiny random Qwen2.5-VL (untrained)", variant=variant)


def build_tiny_scorer(out_dir: str | Path, variant: str = "online_mind2web", seed: int = 0) -> Path:
    """The tiny random Qwen2.5-VL as an (untrained) scorer checkpoint."""
    return write_tiny_scorer_meta(build_tiny_qwen25vl(out_dir, seed=seed), variant)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-pixels", type=int, default=TINY_MIN_PIXELS)
    ap.add_argument("--max-pixels", type=int, default=TINY_MAX_PIXELS)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args(argv)
    out = build_tiny_qwen25vl(args.out, args.seed, args.min_pixels, args.max_pixels, args.dtype)
    print(json.dumps({"model": str(out), "files": sorted(p.name for p in out.iterdir())}))


if __name__ == "__main__":
    main()
