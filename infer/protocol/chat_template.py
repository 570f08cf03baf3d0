"""The scorer's one renderer: its chat text, its images and its training labels.

Training (``train/batches.py``), the in-process scorer (``keyshot.infer.judge.local_scorer.TransformersScorer``), ``keyshot serve``'s
pixel bounds and the dataset builder render a scorer request here, with the processor's own chat template
and ``keyshot.infer.protocol.images.prepare_image`` under the processor's pixel bounds (what ``keyshot serve`` sends), so
the scorer is trained on exactly the tokens and pixels it is served. Only the last assistant answer and
its ``<|im_end|>`` carry labels, known while rendering (the prompt, the answer and the template's tail
are tokenized apart, so the prompt's tokens are the served request's). A row longer than ``max_length`` gets a
smaller ``max_pixels`` (fewer visual tokens) instead of a cut, so image tokens are never truncated.

The plan is the render (docs/architecture.md, "One renderer"): a row's planned visual tokens are the processor's own
``smart_resize`` (both of its pixel bounds, the 28 px grid) applied to the image as it is prepared, and a
smaller ``max_pixels`` is accepted only if the prepared image is not below the processor's ``min_pixels``
(the processor would enlarge it again). A row whose text leaves no room for the smallest such image is
dropped with :data:`NO_IMAGE_ROOM`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.protocol.decode import read_header
from keyshot.infer.protocol.images import (
    DEFAULT_MAX_ASPECT,
    ImagePolicy,
    decode_image,
    open_header,
    pixel_bounds,
    plan_image,
    prepare_image,
    processor_tokens,
    target_size,
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


def image_policy_for(processor, max_aspect: float | None = DEFAULT_MAX_ASPECT) -> ImagePolicy:
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


TEXT_TOO_LONG = "text alone too long"
NO_IMAGE_ROOM = "text leaves no room for the image at min_pixels"


@dataclass(frozen=True)
class ExamplePlan:
    """How one row will be rendered: its length and the pixel bound that keeps it within max_length."""

    row: int
    text_tokens: int  # tokens without the visual ones
    visual_tokens: int  # what the processor emits for the prepared image
    max_pixels: int
    bounded: bool  # max_pixels was lowered to fit max_length
    answer_tokens: int = 0  # the labelled answer with its <|im_end|>: what the scorer learns to generate
    image_size: tuple[int, int] = (0, 0)  # (width, height) of the prepared image the processor receives

    @property
    def length(self) -> int:
        return self.text_tokens + self.visual_tokens

    def describe(self) -> str:
        width, height = self.image_size
        return (
            f"{self.text_tokens} text + {self.visual_tokens} visual tokens, image prepared at {width}x{height} "
            f"under max_pixels={self.max_pixels}"
        )


@dataclass(frozen=True)
class DroppedRow:
    """A row no image size fits into max_length, and why (:data:`TEXT_TOO_LONG` or :data:`NO_IMAGE_ROOM`)."""

    row: int
    reason: str
    text_tokens: int
    room: int  # max_length - text_tokens: the visual tokens the text leaves


class ScorerRenderer:
    """Renders scorer rows with the processor's chat template, images under the processor's policy."""

    def __init__(self, processor, policy: ImagePolicy, max_length: int):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.policy = policy
        self.max_length = max_length
        self.pixel_bounds = processor_pixel_bounds(processor)
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

    def _policy(self, max_pixels: int | None) -> ImagePolicy:
        if max_pixels in (None, self.policy.max_pixels):
            return self.policy
        return dataclasses.replace(self.policy, max_pixels=max_pixels)

    def image_fit(self, size: tuple[int, int], max_pixels: int) -> tuple[tuple[int, int], int]:
        """``((width, height), visual tokens)``: the image :meth:`prepare` makes of a ``size`` screenshot
        under ``max_pixels``, and the tokens the processor emits for it (its own resize, its own bounds)."""
        prepared = plan_image(*size, self._policy(max_pixels))
        lo, hi = self.pixel_bounds
        tokens = processor_tokens(prepared.width, prepared.height, min_pixels=lo, max_pixels=hi)
        return (prepared.width, prepared.height), tokens

    def _lowered_fit(self, size: tuple[int, int], room: int) -> tuple[int, tuple[int, int], int] | None:
        """The largest ``max_pixels`` below the policy's whose image costs at most ``room`` tokens and is
        not below the processor's ``min_pixels``: ``(max_pixels, prepared size, tokens)``, or None."""
        low, high = self.policy.min_pixels, self.policy.max_pixels - 1
        best = None
        while low <= high:  # the prepared image shrinks as max_pixels does
            mid = (low + high) // 2
            if plan_image(*size, self._policy(mid)).visual_tokens <= room:
                best, low = mid, mid + 1
            else:
                high = mid - 1
        if best is None:
            return None
        (width, height), tokens = self.image_fit(size, best)
        if width * height < self.pixel_bounds[0] or tokens > room:
            return None
        return best, (width, height), tokens

    def plan(self, row: int, messages: Sequence[dict], size: tuple[int, int]) -> ExamplePlan | DroppedRow:
        """The row's rendered length and the max_pixels that fit it in max_length, or why it cannot fit."""
        prompt, answer, tail = self.split(messages)
        ids = self._ids(prompt)
        n_pads = sum(1 for t in ids if t == self.image_pad_id)
        if n_pads != 1:
            raise DataError(f"row {row}: the rendered messages hold {n_pads} image placeholders, expected 1")
        answer_tokens = len(self._ids(answer))
        text_tokens = len(ids) - 1 + answer_tokens + len(self._ids(tail))
        width, height = size
        try:
            prepared, tokens = self.image_fit(size, self.policy.max_pixels)
        except ValueError as exc:
            raise DataError(f"row {row}: image {width}x{height}: {exc}") from None
        room = self.max_length - text_tokens
        if tokens <= room:
            return ExamplePlan(
                row, text_tokens, tokens, self.policy.max_pixels, False, answer_tokens, prepared
            )
        if room <= 0:
            return DroppedRow(row, TEXT_TOO_LONG, text_tokens, room)
        fit = self._lowered_fit(size, room)
        if fit is None:
            return DroppedRow(row, NO_IMAGE_ROOM, text_tokens, room)
        max_pixels, prepared, tokens = fit
        return ExamplePlan(row, text_tokens, tokens, max_pixels, True, answer_tokens, prepared)

    def prepare(self, image: Any, max_pixels: int | None = None) -> Image.Image:
        """The image as the scorer is served it under the policy (``max_pixels`` lowered for long rows).

        A JPEG that already has the policy's target size (a dataset of prepared screenshots) is used
        as it is: re-encoding it would move its pixels away from the ones the server decodes.
        """
        policy = self._policy(max_pixels)
        src = image_source(image)
        if isinstance(src, Image.Image):
            img = src
        elif isinstance(src, bytes) and src[:3] == b"\xff\xd8\xff":
            img = read_header(src).image  # its header only: nothing is decoded here
        else:
            img = None
        if (
            img is not None
            and img.format == "JPEG"
            and img.mode == "RGB"
            and img.size == target_size(*img.size, policy)
        ):
            if img is src:
                img.load()
                return img
            return decode_image(src)  # the one decode: the size checked, the pixels in the budget
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
