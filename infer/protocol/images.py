"""The image policy: the one function that turns a screenshot into what the scorer sees.

Every stage (data synthesis, training, serving, the WebJudge outcome call) sends screenshots through
:func:`prepare_image`, so the model is trained on exactly the pixels it is later served.

The policy, in order:

1. **Decode** any PIL mode to 8-bit RGB. Alpha (RGBA, LA, PA, P/L/RGB with a transparency key) is
   composited on white. 16-bit images are scaled to 8 bits (``v * 255 / 65535``), never clipped.
   32-bit integer and float images are scaled by their value range (see :func:`to_rgb`). The header
   is read first: a screenshot whose decode would be larger than a screenshot can be is refused
   before any pixel is decoded, and every decode draws from a process-wide pixel budget
   (:mod:`keyshot.infer.protocol.decode`).
2. **Tall-page rule.** A full-page screenshot taller than ``max_aspect × width`` is cropped from the
   top to ``floor(max_aspect × width)`` rows: what an agent saw first is kept, the footer is dropped.
   A page wider than ``max_aspect × height`` is cropped from the left the same way.
   ``max_aspect=None`` disables cropping (the Qwen2.5-VL processor itself rejects ratios above 200).
   If rounding to 28 px (step 3) would push the result past ``max_aspect``, the crop is trimmed by
   whole 28 px steps, so preparing an already prepared image changes nothing.
3. **Pixel bounds in Qwen2.5-VL terms** (:func:`smart_resize`): both sides are rounded to multiples of
   28 px and the area is kept within ``[min_pixels, max_pixels]``. Qwen2.5-VL spends one visual token per
   28×28 px (14 px patches merged 2×2). With ``resize=True`` the image is resized to exactly those
   dimensions before encoding (OpenCV, :func:`fit`: bicubic up to 1.25× smaller, bilinear below,
   an integer box reduction first beyond 2×), so the processor finds nothing left to resize and
   training and serving see identical pixels. ``resize=False`` sends the (cropped) image at
   its own size, as the reference implementation did; the processor then resizes it.
4. **JPEG** at ``jpeg_quality`` (75, PIL's default, as the reference; OpenCV's libjpeg-turbo writes
   the same bytes as PIL for the same pixels), sent as ``data:image/jpeg``.
"""

from __future__ import annotations

import base64
import io
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

from keyshot.infer.protocol.decode import (
    Header,
    ImageError,
    check_size,
    decoded,
    decoded_extent,
    read_header,
    single_threaded_opencv,
)
from keyshot.infer.protocol.decode import decode_image as decode_image  # the whole screenshot, RGB
from keyshot.infer.protocol.decode import to_rgb as to_rgb  # any PIL mode → RGB, part of the policy's API

logger = logging.getLogger(__name__)

#: Qwen2.5-VL: 14 px patches, merged 2×2 into one visual token.
PATCH_SIZE = 14
MERGE_SIZE = 2
TOKEN_PIXELS = PATCH_SIZE * MERGE_SIZE  # 28: one visual token per 28×28 px
MAX_PROCESSOR_ASPECT = 200.0  # the Qwen2.5-VL processor refuses more elongated images
#: The tall-page rule's default: a page is cropped to at most 4 times as tall as it is wide.
DEFAULT_MAX_ASPECT = 4.0
#: Up to this much smaller, :func:`fit` resamples bicubic; beyond it bilinear (no ringing, less aliasing).
CUBIC_UP_TO = 1.25


@dataclass(frozen=True)
class ImagePolicy:
    """How a screenshot becomes a scorer image. Written into datasets and checkpoints (``to_dict``)."""

    min_pixels: int = 4 * TOKEN_PIXELS * TOKEN_PIXELS  # 3,136
    max_pixels: int = 1280 * TOKEN_PIXELS * TOKEN_PIXELS  # 1,003,520: a 1280×720 shot keeps full size
    max_aspect: float | None = DEFAULT_MAX_ASPECT
    jpeg_quality: int = 75
    resize: bool = True

    def __post_init__(self) -> None:
        if self.min_pixels < TOKEN_PIXELS * TOKEN_PIXELS:
            raise ValueError(
                f"ImagePolicy.min_pixels must be >= {TOKEN_PIXELS**2} (one token), got {self.min_pixels}"
            )
        if self.max_pixels < self.min_pixels:
            raise ValueError(
                f"ImagePolicy.max_pixels ({self.max_pixels}) must be >= min_pixels ({self.min_pixels})"
            )
        if self.max_aspect is not None and not 1.0 <= self.max_aspect <= MAX_PROCESSOR_ASPECT:
            raise ValueError(
                f"ImagePolicy.max_aspect must be None or within [1, {MAX_PROCESSOR_ASPECT:g}], got {self.max_aspect}"
            )
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"ImagePolicy.jpeg_quality must be within [1, 100], got {self.jpeg_quality}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImagePolicy:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ImageError(
                "image_policy", f"unknown ImagePolicy keys {unknown}; known keys: {sorted(known)}"
            )
        return cls(**data)


#: keyshot's policy: resize to Qwen2.5-VL bounds before encoding, tall pages cropped at 4:1.
DEFAULT_POLICY = ImagePolicy()
#: The reference WebJudge: RGB JPEG q75 at the original size; the processor's default bounds apply.
REFERENCE_POLICY = ImagePolicy(min_pixels=3136, max_pixels=12845056, max_aspect=None, resize=False)


@dataclass(frozen=True)
class PreparedImage:
    """A screenshot as the scorer receives it."""

    jpeg: bytes
    width: int
    height: int
    visual_tokens: int
    source_width: int
    source_height: int
    cropped: bool = False

    @property
    def data_url(self) -> str:
        return "data:image/jpeg;base64," + base64.b64encode(self.jpeg).decode("ascii")

    def pil(self) -> Image.Image:
        """The encoded image decoded back to an RGB PIL image (what the processor will see)."""
        img = Image.open(io.BytesIO(self.jpeg))
        img.load()
        return img if img.mode == "RGB" else img.convert("RGB")


def pixel_bounds(settings: dict) -> tuple[int, int] | None:
    """``(min_pixels, max_pixels)`` from an image processor's settings (saved JSON or live attributes).

    Qwen2.5-VL processors keep them as ``min_pixels``/``max_pixels`` or as ``size.shortest_edge``/
    ``size.longest_edge`` depending on the transformers version; None if neither is there.
    """
    size = settings.get("size") or {}
    lo = settings.get("min_pixels") or size.get("shortest_edge")
    hi = settings.get("max_pixels") or size.get("longest_edge")
    return (int(lo), int(hi)) if lo and hi else None


def smart_resize(
    height: int, width: int, *, min_pixels: int, max_pixels: int, factor: int = TOKEN_PIXELS
) -> tuple[int, int]:
    """Qwen2.5-VL's resize target ``(height, width)``: multiples of ``factor``, area in the pixel bounds.

    Sides are rounded to the nearest multiple (Python's round-half-to-even, as the processor); if the
    area then exceeds ``max_pixels`` both sides are scaled down by the same factor and floored, if it
    falls below ``min_pixels`` they are scaled up and ceiled. Raises ``ValueError`` for aspect ratios
    above 200, which the processor rejects.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > MAX_PROCESSOR_ASPECT:
        raise ValueError(
            f"aspect ratio {max(height, width) / min(height, width):.1f} of a {width}x{height} image exceeds "
            f"{MAX_PROCESSOR_ASPECT:g}, which the Qwen2.5-VL processor rejects"
        )
    new_h = round(height / factor) * factor
    new_w = round(width / factor) * factor
    if new_h * new_w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        new_h = max(factor, math.floor(height / scale / factor) * factor)
        new_w = max(factor, math.floor(width / scale / factor) * factor)
    elif new_h * new_w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        new_h = math.ceil(height * scale / factor) * factor
        new_w = math.ceil(width * scale / factor) * factor
    return new_h, new_w


def kept_size(width: int, height: int, max_aspect: float | None) -> tuple[int, int]:
    """``(width, height)`` left after the tall-page rule: crop from the top (or the left) to ``max_aspect``."""
    if max_aspect is None:
        return width, height
    if height > max_aspect * width:
        return width, max(1, math.floor(max_aspect * width))
    if width > max_aspect * height:
        return max(1, math.floor(max_aspect * height)), height
    return width, height


@dataclass(frozen=True)
class ImagePlan:
    """What :func:`prepare_image` does to a ``source`` size: the top-left crop kept and the output size."""

    crop_width: int
    crop_height: int
    width: int
    height: int
    visual_tokens: int


def plan_image(width: int, height: int, policy: ImagePolicy = DEFAULT_POLICY) -> ImagePlan:
    """The crop, output size and token cost of a ``width×height`` screenshot under ``policy``.

    With ``resize=True``, rounding to multiples of 28 can push a just-cropped page past ``max_aspect``
    (a 160×40 crop rounds to 168×28); the long side is then trimmed by whole 28 px steps (and the crop
    with it) so that preparing a prepared image changes nothing.
    """
    crop_w, crop_h = kept_size(width, height, policy.max_aspect)
    new_h, new_w = smart_resize(crop_h, crop_w, min_pixels=policy.min_pixels, max_pixels=policy.max_pixels)
    if policy.max_aspect is not None and policy.resize:
        limit_h = math.floor(policy.max_aspect * new_w / TOKEN_PIXELS) * TOKEN_PIXELS
        limit_w = math.floor(policy.max_aspect * new_h / TOKEN_PIXELS) * TOKEN_PIXELS
        if new_h > limit_h and limit_h * new_w >= policy.min_pixels:
            crop_h = max(1, round(crop_h * limit_h / new_h))
            new_h = limit_h
        elif new_w > limit_w and limit_w * new_h >= policy.min_pixels:
            crop_w = max(1, round(crop_w * limit_w / new_w))
            new_w = limit_w
    tokens = (new_h // TOKEN_PIXELS) * (new_w // TOKEN_PIXELS)
    if not policy.resize:
        return ImagePlan(crop_w, crop_h, crop_w, crop_h, tokens)
    return ImagePlan(crop_w, crop_h, new_w, new_h, tokens)


def target_size(width: int, height: int, policy: ImagePolicy = DEFAULT_POLICY) -> tuple[int, int]:
    """``(width, height)`` of the JPEG that :func:`prepare_image` produces for a ``width×height`` source."""
    plan = plan_image(width, height, policy)
    return plan.width, plan.height


def visual_tokens(width: int, height: int, policy: ImagePolicy = DEFAULT_POLICY) -> int:
    """Qwen2.5-VL visual tokens a ``width×height`` screenshot costs under ``policy``.

    Equals the processor's ``grid_t · grid_h · grid_w / 4`` for the image that is sent. The value is
    the same for the original and for the prepared image (preparing is idempotent).
    """
    return plan_image(width, height, policy).visual_tokens


def processor_tokens(width: int, height: int, *, min_pixels: int, max_pixels: int) -> int:
    """Visual tokens the Qwen2.5-VL processor emits for a ``width×height`` image it resizes into
    ``[min_pixels, max_pixels]``: its own :func:`smart_resize`, one token per 28×28 px (``grid_h·grid_w/4``)."""
    new_h, new_w = smart_resize(height, width, min_pixels=min_pixels, max_pixels=max_pixels)
    return (new_h // TOKEN_PIXELS) * (new_w // TOKEN_PIXELS)


def sniff_image_type(data: bytes) -> tuple[str, str]:
    """(MIME type, file extension) of encoded image bytes, from their signature; bytes of no known
    image type give ``("application/octet-stream", ".img")``."""
    if data.startswith(b"\x89PNG"):
        return "image/png", ".png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg", ".jpg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp", ".webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif", ".gif"
    return "application/octet-stream", ".img"


def open_header(src: Path | str | bytes) -> Image.Image:
    """An image opened for its header (size, format) only: nothing is decoded (see
    :func:`keyshot.infer.protocol.decode.read_header`). Raises ImageError if no format fits."""
    return read_header(src).image


def decoded_pixels(header: Header, policy: ImagePolicy = DEFAULT_POLICY) -> int:
    """How many pixels preparing this screenshot under ``policy`` decodes: the policy's crop for a PNG
    read in row order, the whole image for other formats (a JPEG at its reduced scale)."""
    plan = _plan(header, policy)
    w, h = decoded_extent(header, (plan.crop_width, plan.crop_height), (plan.width, plan.height))
    return w * h


def _plan(header: Header, policy: ImagePolicy) -> ImagePlan:
    try:
        return plan_image(*header.size, policy)
    except ValueError as exc:
        raise ImageError(header.name, str(exc)) from exc


def check_screenshot(
    src: Path | str | bytes | Image.Image, policy: ImagePolicy = DEFAULT_POLICY
) -> tuple[Header, int]:
    """A screenshot's header and the pixels preparing it under ``policy`` decodes, from its header alone:
    :class:`~keyshot.infer.protocol.decode.ImageTooLarge` beyond what a screenshot can be,
    :class:`ImageError` if it is no readable image."""
    header = read_header(src)
    pixels = decoded_pixels(header, policy)
    check_size(header, pixels)
    return header, pixels


def fit(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """An RGB array resized to ``width×height`` (OpenCV): bicubic when it shrinks at most
    :data:`CUBIC_UP_TO` times (or grows), bilinear beyond; more than 2× smaller, an exact box
    reduction by a whole factor first (a column or row short of a multiple is dropped at the right
    or bottom), so that no source pixel is skipped."""
    h, w = pixels.shape[:2]
    if (w, h) == (width, height):
        return pixels
    single_threaded_opencv()
    factor = math.ceil(min(w / width, h / height) / 2)
    if factor >= 2:
        h, w = h - h % factor, w - w % factor
        pixels = cv2.resize(pixels[:h, :w], (w // factor, h // factor), interpolation=cv2.INTER_AREA)
        h, w = pixels.shape[:2]
    shrink = max(w / width, h / height)
    method = cv2.INTER_CUBIC if shrink <= CUBIC_UP_TO else cv2.INTER_LINEAR
    return cv2.resize(pixels, (width, height), interpolation=method)


def encode_jpeg(pixels: np.ndarray, quality: int) -> bytes:
    """An RGB array as a baseline JPEG (libjpeg-turbo through OpenCV: PIL's bytes for the same pixels)."""
    single_threaded_opencv()
    ok, encoded = cv2.imencode(
        ".jpg", cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise ImageError("<encoder>", f"OpenCV could not encode a {pixels.shape} image as JPEG")
    return encoded.tobytes()


def prepare_image(
    src: Path | str | bytes | Image.Image, policy: ImagePolicy = DEFAULT_POLICY
) -> PreparedImage:
    """Turn a screenshot (a path, encoded bytes or a PIL image) into the scorer's JPEG under ``policy``.

    The one function every screenshot is decoded through (judging, synthesis, datasets, rewards): its
    header is read first and a decode larger than a screenshot can be is refused; the decode, resize
    and encode hold their pixels in the process-wide budget. Raises :class:`ImageError` naming the
    source for unreadable, empty, corrupt, truncated or over-sized files.
    """
    header = read_header(src)
    src_w, src_h = header.size
    plan = _plan(header, policy)
    crop, out = (plan.crop_width, plan.crop_height), (plan.width, plan.height)
    with decoded(header, crop, out) as rgb:
        rgb = fit(rgb, *out)  # the decoded pixels go before the encode: ~7% faster, the allocator reuses them
        jpeg = encode_jpeg(rgb, policy.jpeg_quality)
    return PreparedImage(
        jpeg=jpeg,
        width=plan.width,
        height=plan.height,
        visual_tokens=plan.visual_tokens,
        source_width=src_w,
        source_height=src_h,
        cropped=crop != (src_w, src_h),
    )
