"""The scorer's one renderer: its chat text, its images and its training labels.

Training (``train/batches.py``), the in-process scorer (``keyshot.infer.judge.local_scorer.TransformersScorer``), ``keyshot serve``'s
pixel bounds and the dataset builder render a scorer request here, with the processor's own chat template
and ``keyshot.infer.protocol.images.prepare_image`` under the processor's pixel bounds (what ``keyshot serve`` sends), so
the scorer is trained on exactly the tokens and pixels it is served. Only the last assistant answer and
its ``<|im_end|>`` carry labels, known while rendering (the prompt, the answer and the template's tail
are tokenized apart, so the prompt's tokens are the served request's). A row longer than ``max_length`` gets a smaller ``max_pixels`` (fewer
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

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.protocol.images import (
    TOKEN_PIXELS,
    ImagePolicy,
    open_header,
    pixel_bounds,
    prepare_image,
    target_size,
    visual_tokens,
)

IGNORE_INDEX = -100
IM_END = "<|im_end|>"
IMAGE_PAD = "<|image_pad|>"


class DataError(KeyshotError, ValueError):
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
    if not isinstance(size, dict):
        size = {k: getattr(size, k, None) for k in ("shortest_edge", "longest_edge")}
    settings = {"min_pixels": getattr(ip, "min_pixels", None), "max_pixels": getattr(ip, "max_pixels", None)}
    bounds = pixel_bounds({**settings, "size": size})
    if not bounds:
        raise DataError(f"cannot read the pixel bounds of image processor {type(ip).__name__}: size={size}")
    return bounds


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
    src = image_source(value)
    return src.size if isinstance(src, Image.Image) else open_header(src).size


def image_source(value: Any):
    """What :func:`keyshot.infer.protocol.images.prepare_image` accepts, from a dataset image cell."""
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict):
        if value.get("bytes"):
            return value["bytes"]
        if value.get("path"):
            return Path(value["path"])
    raise DataError(f"unsupported image cell {type(value).__name__}: expected a PIL image or {{bytes, path}}")


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

    def split(self, messages: Sequence[dict]) -> tuple[str, str, str]:
        """The row's text as ``(prompt, answer, tail)``: what the scorer is served, what it must answer.

        ``prompt`` is the serving request (the turns before the answer and the generation prompt),
        ``answer`` the last assistant answer with its ``<|im_end|>`` (the labelled part), ``tail`` what the
        template writes after it. Each is tokenized on its own, so the labelled span is known by
        construction and the prompt's tokens are exactly the ones a served request has.
        """
        turns = clean_messages(messages)
        if not turns or turns[-1]["role"] != "assistant":
            raise DataError(
                "no assistant turn found: a training row needs the target answer as its last turn"
            )
        prompt = self.chat_text(turns[:-1], generation_prompt=True)
        full = self.chat_text(turns)
        if not full.startswith(prompt):
            raise DataError("the chat template does not write the answer after the generation prompt")
        rest = full[len(prompt) :]
        end = rest.rfind(IM_END)
        if end < 0:
            raise DataError("the assistant answer has no <|im_end|>")
        if not rest[:end].strip():
            raise DataError("the assistant answer is empty")
        return prompt, rest[: end + len(IM_END)], rest[end + len(IM_END) :]

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def plan(self, row: int, messages: Sequence[dict], size: tuple[int, int]) -> ExamplePlan | None:
        """Length of a row and the max_pixels that fit it in max_length; None if even the smallest image does not."""
        prompt, answer, tail = self.split(messages)
        ids = self._ids(prompt)
        n_pads = sum(1 for t in ids if t == self.image_pad_id)
        if n_pads != 1:
            raise DataError(f"row {row}: the rendered messages hold {n_pads} image placeholders, expected 1")
        text_tokens = len(ids) - 1 + len(self._ids(answer)) + len(self._ids(tail))
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
        """One training example: 1-D ``input_ids``/``attention_mask``/``labels``, the image tensors.

        The prompt goes through the processor (which expands the image placeholder); the answer and the
        template's tail are appended as tokens, the answer labelled, everything else IGNORE_INDEX.
        """
        prompt, answer, tail = self.split(messages)
        enc = self.processor(text=[prompt], images=[self.prepare(image, max_pixels)], return_tensors="pt")
        answer_ids = torch.tensor(self._ids(answer), dtype=torch.long)
        tail_ids = torch.tensor(self._ids(tail), dtype=torch.long)
        prompt_ids = enc["input_ids"][0]
        ignore = torch.full_like(prompt_ids, IGNORE_INDEX)
        example = {
            "input_ids": torch.cat([prompt_ids, answer_ids, tail_ids]),
            "attention_mask": torch.ones(len(prompt_ids) + len(answer_ids) + len(tail_ids), dtype=torch.long),
            "labels": torch.cat([ignore, answer_ids, torch.full_like(tail_ids, IGNORE_INDEX)]),
            "pixel_values": enc["pixel_values"],
            "image_grid_thw": enc["image_grid_thw"],
        }
        if "mm_token_type_ids" in enc:
            kinds = enc["mm_token_type_ids"][0]
            example["mm_token_type_ids"] = torch.cat(
                [kinds, kinds.new_zeros(len(answer_ids) + len(tail_ids))]
            )
        return example

    def render_prompt(self, messages: Sequence[dict], image: Any) -> dict[str, torch.Tensor]:
        """The generation request for a row: its turns up to (not including) the answer, batched (1, L)."""
        turns = list(messages)
        if turns and turns[-1]["role"] == "assistant":
            turns = turns[:-1]
        text = self.chat_text(turns, generation_prompt=True)
        return dict(self.processor(text=[text], images=[self.prepare(image)], return_tensors="pt"))
