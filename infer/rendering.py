"""The scorer's one renderer: its chat text, its images and its training labels.

Training (``train/data.py``), the in-process scorer (``infer.scorer.TransformersScorer``), ``keyshot serve``'s
pixel bounds and the dataset builder render a scorer request here, with the processor's own chat template
and ``infer.images.prepare_image`` under the processor's pixel bounds (what ``keyshot serve`` sends), so
the scorer is trained on exactly the tokens and pixels it is served. Only the last assistant answer and
its ``<|im_end|>`` carry labels. A row longer than ``max_length`` gets a smaller ``max_pixels`` (fewer
visual tokens) instead of a cut, so image tokens are never truncated.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from infer.images import TOKEN_PIXELS, ImagePolicy, prepare_image, target_size, visual_tokens

IGNORE_INDEX = -100
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
IMAGE_PAD = "<|image_pad|>"
ASSISTANT_HEADER = "assistant\n"  # what follows <|im_start|> in an assistant turn


class DataError(ValueError):
    """A dataset, row or rendering that the scorer's training path cannot use; the message says which."""


def clean_messages(messages: Sequence[dict]) -> list[dict]:
    """Drop the ``None`` keys Arrow adds to content parts (the Qwen template would read them as images)."""
    out = []
    for turn in messages:
        content = turn["content"]
        if not isinstance(content, str):
            content = [{k: v for k, v in part.items() if v is not None} for part in content]
        out.append({"role": turn["role"], "content": content})
    return out


def processor_pixel_bounds(processor) -> tuple[int, int]:
    """``(min_pixels, max_pixels)`` the processor resizes images into."""
    ip = processor.image_processor
    size = getattr(ip, "size", None) or {}
    get = size.get if hasattr(size, "get") else lambda k: getattr(size, k, None)
    lo = getattr(ip, "min_pixels", None) or get("shortest_edge")
    hi = getattr(ip, "max_pixels", None) or get("longest_edge")
    if not lo or not hi:
        raise DataError(f"cannot read the pixel bounds of image processor {type(ip).__name__}: size={size}")
    return int(lo), int(hi)


def set_processor_pixel_bounds(processor, min_pixels: int, max_pixels: int) -> None:
    """Make the processor (and what it saves) resize into ``[min_pixels, max_pixels]``."""
    for proc in (processor.image_processor, getattr(processor, "video_processor", None)):
        if proc is None:
            continue
        proc.size = {"shortest_edge": int(min_pixels), "longest_edge": int(max_pixels)}
        for name, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
            if hasattr(proc, name):
                setattr(proc, name, int(value))


def image_policy_for(processor, max_aspect: float | None = 4.0) -> ImagePolicy:
    """The image policy whose bounds are the processor's: the scorer is trained on what it is served."""
    lo, hi = processor_pixel_bounds(processor)
    return ImagePolicy(min_pixels=lo, max_pixels=hi, max_aspect=max_aspect)


def image_size(value: Any) -> tuple[int, int]:
    """``(width, height)`` of a dataset image cell without decoding its pixels."""
    if isinstance(value, Image.Image):
        return value.size
    if isinstance(value, dict):
        if value.get("bytes"):
            return Image.open(io.BytesIO(value["bytes"])).size
        if value.get("path"):
            return Image.open(value["path"]).size
    raise DataError(f"unsupported image cell {type(value).__name__}: expected a PIL image or {{bytes, path}}")


def image_source(value: Any):
    """What :func:`infer.images.prepare_image` accepts, from a dataset image cell."""
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict):
        if value.get("bytes"):
            return value["bytes"]
        if value.get("path"):
            return Path(value["path"])
    raise DataError(f"unsupported image cell {type(value).__name__}: expected a PIL image or {{bytes, path}}")


def find_assistant_span(input_ids: Sequence[int], tokenizer) -> tuple[int, int]:
    """``[start, end)`` of the LAST assistant answer, ``<|im_end|>`` included.

    Found by token ids: the last ``<|im_start|>`` whose next tokens spell ``assistant\\n``. The word
    "assistant" inside user text is not preceded by the ``<|im_start|>`` special token, and a forged
    header inside user text comes before the real last one. If the answer's first characters merged
    into the header's newline token, that token is labelled (it carries answer text).
    """
    im_start = tokenizer.convert_tokens_to_ids(IM_START)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    ids = list(input_ids)
    for pos in reversed([i for i, t in enumerate(ids) if t == im_start]):
        text, k = "", pos + 1
        while k < len(ids) and len(text) < len(ASSISTANT_HEADER) and ids[k] not in (im_start, im_end):
            text += tokenizer.decode([ids[k]])
            k += 1
        if not text.startswith(ASSISTANT_HEADER):
            continue
        start = k if len(text) == len(ASSISTANT_HEADER) else k - 1
        try:
            end = ids.index(im_end, start)
        except ValueError:
            raise DataError("the assistant answer has no <|im_end|> (was the sequence cut?)") from None
        if end == start:
            raise DataError("the assistant answer is empty")
        return start, end + 1
    raise DataError("no assistant turn found: a training row needs the target answer as its last turn")


def assistant_labels(input_ids: Sequence[int], tokenizer) -> list[int]:
    """Labels for ``input_ids``: the last assistant answer and its ``<|im_end|>``, IGNORE_INDEX elsewhere."""
    start, end = find_assistant_span(input_ids, tokenizer)
    labels = [IGNORE_INDEX] * len(input_ids)
    labels[start:end] = list(input_ids[start:end])
    return labels


@dataclass(frozen=True)
class ExamplePlan:
    """How one row will be rendered: its length and the pixel bound that keeps it within max_length."""

    row: int
    text_tokens: int  # tokens without the visual ones
    visual_tokens: int
    max_pixels: int
    bounded: bool  # max_pixels was lowered to fit max_length

    @property
    def length(self) -> int:
        return self.text_tokens + self.visual_tokens


class ScorerRenderer:
    """Renders scorer rows with the processor's chat template, images under the processor's policy."""

    def __init__(self, processor, policy: ImagePolicy, max_length: int):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.policy = policy
        self.max_length = max_length
        self.image_pad_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    def chat_text(self, messages: Sequence[dict], *, generation_prompt: bool = False) -> str:
        return self.processor.apply_chat_template(
            clean_messages(messages), tokenize=False, add_generation_prompt=generation_prompt
        )

    def plan(self, row: int, messages: Sequence[dict], size: tuple[int, int]) -> ExamplePlan | None:
        """Length of a row and the max_pixels that fit it in max_length; None if even the smallest image does not."""
        ids = self.tokenizer(self.chat_text(messages), add_special_tokens=False)["input_ids"]
        n_pads = sum(1 for t in ids if t == self.image_pad_id)
        if n_pads != 1:
            raise DataError(f"row {row}: the rendered messages hold {n_pads} image placeholders, expected 1")
        text_tokens = len(ids) - 1
        width, height = size
        try:
            tokens = visual_tokens(width, height, self.policy)
        except ValueError as exc:
            raise DataError(f"row {row}: image {width}x{height}: {exc}") from None
        budget = self.max_length - text_tokens
        if tokens <= budget:
            return ExamplePlan(row, text_tokens, tokens, self.policy.max_pixels, bounded=False)
        max_pixels = budget * TOKEN_PIXELS * TOKEN_PIXELS
        while max_pixels >= self.policy.min_pixels:
            policy = dataclasses.replace(self.policy, max_pixels=max_pixels)
            tokens = visual_tokens(width, height, policy)
            if tokens <= budget:
                return ExamplePlan(row, text_tokens, tokens, max_pixels, bounded=True)
            max_pixels -= TOKEN_PIXELS * TOKEN_PIXELS
        return None

    def prepare(self, image: Any, max_pixels: int | None = None) -> Image.Image:
        """The image as the scorer is served it under the policy (``max_pixels`` lowered for long rows).

        A JPEG that already has the policy's target size (a dataset of prepared screenshots) is used
        as it is: re-encoding it would move its pixels away from the ones the server decodes.
        """
        policy = self.policy
        if max_pixels not in (None, policy.max_pixels):
            policy = dataclasses.replace(policy, max_pixels=max_pixels)
        src = image_source(image)
        prepared = src if isinstance(src, Image.Image) else None
        if isinstance(src, bytes) and src[:3] == b"\xff\xd8\xff":
            prepared = Image.open(io.BytesIO(src))
        if (
            prepared is not None
            and prepared.format == "JPEG"
            and prepared.mode == "RGB"
            and prepared.size == target_size(*prepared.size, policy)
        ):
            prepared.load()
            return prepared
        return prepare_image(src, policy).pil()

    def render(
        self, messages: Sequence[dict], image: Any, max_pixels: int | None = None
    ) -> dict[str, torch.Tensor]:
        """One training example: 1-D ``input_ids``/``attention_mask``/``labels``, the image tensors."""
        enc = self.processor(
            text=[self.chat_text(messages)], images=[self.prepare(image, max_pixels)], return_tensors="pt"
        )
        input_ids = enc["input_ids"][0]
        example = {
            "input_ids": input_ids,
            "attention_mask": enc["attention_mask"][0],
            "labels": torch.tensor(assistant_labels(input_ids.tolist(), self.tokenizer), dtype=torch.long),
            "pixel_values": enc["pixel_values"],
            "image_grid_thw": enc["image_grid_thw"],
        }
        if "mm_token_type_ids" in enc:
            example["mm_token_type_ids"] = enc["mm_token_type_ids"][0]
        return example

    def render_prompt(self, messages: Sequence[dict], image: Any) -> dict[str, torch.Tensor]:
        """The generation request for a row: its turns up to (not including) the answer, batched (1, L)."""
        turns = list(messages)
        if turns and turns[-1]["role"] == "assistant":
            turns = turns[:-1]
        text = self.chat_text(turns, generation_prompt=True)
        return dict(self.processor(text=[text], images=[self.prepare(image)], return_tensors="pt"))
