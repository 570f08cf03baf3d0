"""The image policy: the one function that turns a screenshot into what the scorer sees.

Every stage (data synthesis, training, serving, the WebJudge outcome call) sends screenshots through
:func:`prepare_image`, so the model is trained on exactly the pixels it is later served.

The policy, in order:

1. **Decode** any PIL mode to 8-bit RGB. Alpha (RGBA, LA, PA, P/L/RGB with a transparency key) is
   composited on white. 16-bit images are scaled to 8 bits (``v * 255 / 65535``), never clipped.
   32-bit integer and float images are scaled by their value range (see :func:`to_rgb`).
2. **Tall-page rule.** A full-page screenshot taller than ``max_aspect × width`` is cropped from the
   top to ``floor(max_aspect × width)`` rows: what an agent saw first is kept, the footer is dropped.
   A page wider than ``max_aspect × height`` is cropped from the left the same way.
   ``max_aspect=None`` disables cropping (the Qwen2.5-VL processor itself rejects ratios above 200).
   If rounding to 28 px (step 3) would push the result past ``max_aspect``, the crop is trimmed by
   whole 28 px steps, so preparing an already prepared image changes nothing.
3. **Pixel bounds in Qwen2.5-VL terms** (:func:`smart_resize`): both sides are rounded to multiples of
   28 px and the area is kept within ``[min_pixels, max_pixels]``. Qwen2.5-VL spends one visual token per
   28×28 px (14 px patches merged 2×2). With ``resize=True`` the image is resized (bicubic, as the
   processor) to exactly those dimensions before encoding, so the processor finds nothing left to
   resize and training and serving see identical pixels. ``resize=False`` sends the (cropped) image at
   its own size, as the reference implementation did; the processor then resizes it.
4. **JPEG** at ``jpeg_quality`` (75, PIL's default, as the reference), sent as ``data:image/jpeg``.
"""

from __future__ import annotations

import base64
import io
import logging
import math
import struct
import zlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from keyshot.infer.common.errors import KeyshotError

logger = logging.getLogger(__name__)

#: Qwen2.5-VL: 14 px patches, merged 2×2 into one visual token.
PATCH_SIZE = 14
MERGE_SIZE = 2
TOKEN_PIXELS = PATCH_SIZE * MERGE_SIZE  # 28: one visual token per 28×28 px
MAX_PROCESSOR_ASPECT = 200.0  # the Qwen2.5-VL processor refuses more elongated images

WHITE = (255, 255, 255)
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
# What a broken or hostile file can make PIL raise while opening or decoding.
_DECODE_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    struct.error,
    zlib.error,
    Image.DecompressionBombError,
)


class ImageError(KeyshotError, ValueError):
    """A screenshot that cannot be decoded or turned into a scorer image; the message names its source."""

    def __init__(self, source: str, problem: str):
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem


@dataclass(frozen=True)
class ImagePolicy:
    """How a screenshot becomes a scorer image. Written into datasets and checkpoints (``to_dict``)."""

    min_pixels: int = 4 * TOKEN_PIXELS * TOKEN_PIXELS  # 3,136
    max_pixels: int = 1280 * TOKEN_PIXELS * TOKEN_PIXELS  # 1,003,520: a 1280×720 shot keeps full size
    max_aspect: float | None = 4.0
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


def _open(src: Path | str | bytes | Image.Image) -> tuple[Image.Image, str]:
    if isinstance(src, Image.Image):
        return src, "<PIL image>"
    if isinstance(src, (bytes, bytearray, memoryview)):
        data = bytes(src)
        name = f"<{len(data)} bytes>"
    elif isinstance(src, (str, Path)):
        name = str(src)
        try:
            data = Path(src).read_bytes()
        except OSError as exc:
            raise ImageError(name, f"cannot read file: {exc.strerror or exc}") from exc
    else:
        raise TypeError(f"prepare_image takes a path, bytes or a PIL image, not {type(src).__name__}")
    if not data:
        raise ImageError(name, "empty file (0 bytes), not an image")
    try:
        return Image.open(io.BytesIO(data)), name
    except Image.UnidentifiedImageError as exc:
        raise ImageError(name, "not an image file (PIL cannot identify its format)") from exc
    except Image.DecompressionBombError:
        return _open_tall(data, name), name  # a full-page screenshot: read its top, as the policy says
    except _DECODE_ERRORS as exc:
        raise ImageError(name, f"cannot open image: {exc}") from exc


#: The tallest part of an over-sized image keyshot decodes: the policy never keeps more than
#: ``max_aspect`` (≤ this) heights of width from the top of a page.
_TALL_DECODE_ASPECT = 8.0


def _open_tall(data: bytes, name: str) -> Image.Image:
    """Open (header only) an image larger than PIL's decompression-bomb limit when it is a tall page
    whose top part fits the limit; only that part is ever decoded (:func:`prepare_image` bounds the
    decode). Anything else stays refused: a wide or square image that large is no screenshot."""
    img = open_header(data)
    width, height = img.size
    if img.format != "PNG" or len(img.tile) != 1 or img.info.get("interlace"):
        raise ImageError(
            name, f"image of {width}×{height} pixels is too large to decode (not a sequential PNG)"
        )
    if width * math.ceil(width * _TALL_DECODE_ASPECT) > (Image.MAX_IMAGE_PIXELS or 0) * 2:
        raise ImageError(name, f"image of {width}×{height} pixels is too large to decode, even cropped")
    img.info["keyshot_tall_page"] = True
    return img


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
    """An image opened for its header (size, format) without PIL's decompression-bomb check: nothing
    is decoded, so the check's memory concern does not arise. Raises ImageError if no format fits."""
    data = Path(src).read_bytes()[: 1 << 20] if isinstance(src, (str, Path)) else bytes(src)
    Image.preinit()
    Image.init()
    prefix = data[:16]
    for fmt, (factory, accept) in Image.OPEN.items():
        if accept is None or accept(prefix):
            try:
                img = factory(io.BytesIO(data), "")
            except _DECODE_ERRORS:
                continue
            img.format = img.format or fmt
            return img
    raise ImageError(
        str(src)[:80] if not isinstance(src, bytes) else f"<{len(data)} bytes>", "not an image file"
    )


def _bound_tall_decode(img: Image.Image, rows: int) -> None:
    """Make a tall PNG decode only its first ``rows`` rows (the policy's crop) on ``load()``."""
    if not img.info.get("keyshot_tall_page") or rows >= img.size[1]:
        return
    tile = img.tile[0]
    img._size = (img.size[0], rows)
    img.tile = [tile._replace(extents=(0, 0, img.size[0], rows))]


def decode_image(src: Path | str | bytes | Image.Image) -> Image.Image:
    """Open and fully decode an image (any format PIL reads); errors become :class:`ImageError`."""
    img, name = _open(src)
    _load(img, name)
    return img


def _load(img: Image.Image, name: str) -> None:
    try:
        img.load()
    except _DECODE_ERRORS as exc:
        raise ImageError(name, f"corrupt or truncated image: {exc}") from exc


def _scaled_to_uint8(values: np.ndarray) -> np.ndarray:
    """Map single-channel values to 0..255 by their range: 8-bit, 16-bit, [0, 1] floats, else min-max."""
    arr = np.nan_to_num(values.astype(np.float64, copy=False), nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)
    if lo >= 0.0 and hi <= 1.0 and values.dtype.kind == "f":
        scaled = arr * 255.0
    elif lo >= 0.0 and hi <= 255.0:
        scaled = arr
    elif lo >= 0.0 and hi <= 65535.0:
        scaled = arr * (255.0 / 65535.0)
    else:
        scaled = (arr - lo) * (255.0 / (hi - lo))
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _has_transparency(img: Image.Image) -> bool:
    return img.mode in _ALPHA_MODES or (img.mode in {"P", "L", "RGB"} and "transparency" in img.info)


def _composite_on_white(img: Image.Image) -> Image.Image:
    rgba = img if img.mode == "RGBA" else img.convert("RGBA")
    alpha = rgba.getchannel("A")
    if alpha.getextrema() == (255, 255):
        return rgba.convert("RGB")
    background = Image.new("RGB", rgba.size, WHITE)
    background.paste(rgba.convert("RGB"), mask=alpha)
    return background


def to_rgb(img: Image.Image, source: str = "<image>") -> Image.Image:
    """Any PIL mode → 8-bit RGB (returns ``img`` itself when it already is RGB without transparency).

    Alpha is composited on white. ``I;16*`` is scaled ``v·255/65535``. ``I`` and ``F`` are scaled by
    their range: values within [0, 1] (float only) → ×255, within [0, 255] → as is, within [0, 65535]
    → ×255/65535, anything else (negative, larger) → min-max stretched.
    """
    mode = img.mode
    if mode == "RGB" and "transparency" not in img.info:
        return img
    if _has_transparency(img):
        if mode == "La":
            img = img.convert("LA")
        elif mode == "RGBa":
            img = img.convert("RGBA")
        return _composite_on_white(img)
    if mode in _SIXTEEN_BIT_MODES:
        arr = np.asarray(img).astype(np.uint32)
        gray = ((arr * 255 + 32767) // 65535).astype(np.uint8)
        return Image.fromarray(gray, mode="L").convert("RGB")
    if mode in {"I", "F"}:
        return Image.fromarray(_scaled_to_uint8(np.asarray(img)), mode="L").convert("RGB")
    try:
        return img.convert("RGB")
    except ValueError as exc:
        raise ImageError(source, f"unsupported image mode {mode!r}: {exc}") from exc


def prepare_image(
    src: Path | str | bytes | Image.Image, policy: ImagePolicy = DEFAULT_POLICY
) -> PreparedImage:
    """Turn a screenshot (a path, encoded bytes or a PIL image) into the scorer's JPEG under ``policy``.

    Raises :class:`ImageError` naming the source for unreadable, empty, corrupt or truncated files.
    """
    img, name = _open(src)
    src_w, src_h = img.size
    try:
        plan = plan_image(src_w, src_h, policy)
    except ValueError as exc:
        raise ImageError(name, str(exc)) from exc
    out_w, out_h = plan.width, plan.height

    # A JPEG that will be shrunk at least 2× decodes faster at a reduced DCT scale (never below target).
    owned = not isinstance(src, Image.Image)  # never change the mode/scale of a caller's image
    if owned and img.format == "JPEG" and out_w * 2 <= plan.crop_width and out_h * 2 <= plan.crop_height:
        img.draft(
            None, (math.ceil(src_w * out_w / plan.crop_width), math.ceil(src_h * out_h / plan.crop_height))
        )
    _bound_tall_decode(img, plan.crop_height)
    _load(img, name)

    cropped = (plan.crop_width, plan.crop_height) != (src_w, src_h)
    if cropped:
        # Crop in the decoded image's coordinates (a JPEG draft may have scaled it).
        box_w = max(1, round(plan.crop_width * img.size[0] / src_w))
        box_h = max(1, round(plan.crop_height * img.size[1] / src_h))
        img = img.crop((0, 0, box_w, box_h))
    rgb = to_rgb(img, name)
    if rgb.size != (out_w, out_h):
        rgb = rgb.resize((out_w, out_h), Image.Resampling.BICUBIC)

    buffer = io.BytesIO()
    rgb.save(buffer, format="JPEG", quality=policy.jpeg_quality)
    return PreparedImage(
        jpeg=buffer.getvalue(),
        width=out_w,
        height=out_h,
        visual_tokens=plan.visual_tokens,
        source_width=src_w,
        source_height=src_h,
        cropped=cropped,
    )
