"""Opening a screenshot without trusting it: the header first, then a decode bounded in pixels.

A PNG of 20 KiB can hold 169 M pixels (507 MB as RGB). So nothing is decoded before its header says
how many pixels the decode will produce under the image policy (:func:`decoded_pixels`), and a
screenshot whose decode is beyond what a screenshot can be is refused with one line naming it
(:class:`ImageTooLarge`).

**The limit** (:data:`MAX_DECODED_PIXELS`, 2^26 = 67,108,864 pixels decoded per screenshot): an 8K
display is 33 M pixels; a full-page screenshot is cropped by the policy to ``max_aspect`` (4:1) heights
of its width and only that top part is decoded, so a 3840 px wide page (a 1280 px layout at 3×) decodes
at most 3840×15360 = 59 M pixels whatever its length; a 1280×30000 page sent whole by the reference
policy is 38 M. A JPEG, WebP or interlaced PNG cannot stop at the crop: its whole (or, for a JPEG
shrunk at least 2×, its reduced-DCT) size counts. PIL's own limit (``Image.MAX_IMAGE_PIXELS``) stays in
force for every image PIL decodes, as a second line.

**The budget** (:data:`DECODE_BUDGET`): the decoded pixels held at once by the whole process, threads
and event loops alike, are bounded. :func:`keyshot.infer.protocol.images.prepare_image` holds its
screenshot's pixels from the decode to the encode, so N concurrent requests wait for each other
instead of decoding N screenshots of the limit at once.

**The decoders** (:func:`decode_rgb`): 8-bit PNGs go to libspng (``pyspng``), RGB and gray JPEGs to
OpenCV's libjpeg-turbo: both decode the same pixels as PIL, faster. PIL decodes everything else (16-bit,
palette or gray with a transparency key, WebP, GIF, ...) and the top rows of a tall page, and
:func:`to_rgb` turns its modes into RGB. pyspng holds the GIL while it decodes (about 7 ms for a
2560×1440 screenshot): threads preparing screenshots decode one at a time and resize and encode in
parallel (OpenCV releases the GIL). imagecodecs' PNG decoder releases it and costs about 1.5× libspng's
(a row of ``bench/images.py``), should many cores ever prepare screenshots in one process.
"""

from __future__ import annotations

import io
import math
import struct
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pyspng
from PIL import Image

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import PerProcess

#: Pixels one screenshot may decode (see the module's docstring for why 2^26).
MAX_DECODED_PIXELS = 1 << 26
#: Pixels the whole process may hold decoded at once (one screenshot of the limit, or ~70 at 1280×720).
DECODE_BUDGET_PIXELS = MAX_DECODED_PIXELS

WHITE = (255, 255, 255)
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
# What a broken or hostile file can make a decoder raise while opening or decoding.
_DECODE_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    RuntimeError,  # libspng (pyspng)
    cv2.error,
    struct.error,
    zlib.error,
    Image.DecompressionBombError,
)
# The PNG raw modes libspng decodes to exactly PIL's pixels (8 bits a sample).
_SPNG_MODES = {"RGB": "RGB", "L": "RGB", "P": "RGB", "RGBA": "RGBA"}
_OPENCV_JPEG = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}

_opencv_set = False


def single_threaded_opencv() -> None:
    """Set OpenCV to one thread, once, when keyshot first decodes, resizes or encodes a screenshot (not at
    import: importing keyshot changes nothing in the process). keyshot parallelises over screenshots
    (``image_workers``, dataset threads); OpenCV's own threads would only contend with them."""
    global _opencv_set
    if not _opencv_set:
        cv2.setNumThreads(1)
        _opencv_set = True


class ImageError(KeyshotError, ValueError):
    """A screenshot that cannot be decoded or turned into a scorer image; the message names its source."""

    def __init__(self, source: str, problem: str):
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem


class ImageTooLarge(ImageError):
    """A screenshot whose decode would be larger than a screenshot can be (refused before decoding)."""


class _Held:
    """What a :class:`PixelBudget` holds now in this process: the pixels held, the callers waiting, and
    the condition they wait on."""

    def __init__(self) -> None:
        self.in_use = 0
        self.waiting = 0
        self.cond = threading.Condition()


class PixelBudget:
    """A process-wide semaphore counted in decoded pixels.

    ``hold(n)`` waits until ``n`` more pixels fit, holds them for the ``with`` block and releases them.
    A request above the whole budget waits until nothing else is held and then holds it all, so one
    screenshot of the limit runs alone and never waits forever. A forked child starts with nothing held
    (:class:`~keyshot.infer.common.processes.PerProcess`): the parent's holders are not there to release.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"PixelBudget capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._per_process: PerProcess[_Held] | None = None  # made at first use (no fork hook at import)
        self._making = threading.Lock()

    @property
    def _held(self) -> _Held:
        """What this process holds now."""
        if self._per_process is None:
            with self._making:
                if self._per_process is None:
                    self._per_process = PerProcess(_Held)
        return self._per_process.items

    @property
    def in_use(self) -> int:
        """The pixels held now."""
        return self._held.in_use

    @contextmanager
    def hold(self, pixels: int) -> Iterator[None]:
        need = max(1, min(int(pixels), self.capacity))
        held = self._held
        with held.cond:
            held.waiting += 1
            held.cond.notify_all()  # wait_for_waiters() watches this count
            try:
                held.cond.wait_for(lambda: held.in_use + need <= self.capacity)
            finally:
                held.waiting -= 1
            held.in_use += need
        try:
            yield
        finally:
            if held is self._held:  # not across a fork: a child's budget starts empty
                with held.cond:
                    held.in_use -= need
                    held.cond.notify_all()

    def wait_for_waiters(self, count: int, timeout: float) -> bool:
        """True once at least ``count`` callers wait for pixels (for tests and benchmarks)."""
        held = self._held
        with held.cond:
            return held.cond.wait_for(lambda: held.waiting >= count, timeout)


#: The one budget every screenshot decode of this process draws from.
DECODE_BUDGET = PixelBudget(DECODE_BUDGET_PIXELS)


@dataclass(frozen=True)
class Header:
    """A screenshot opened for its header only: size, format and mode, and the bytes to decode later.

    ``image`` is PIL's lazily opened image (nothing decoded), or the caller's own image for a PIL
    source (``data`` None).
    """

    name: str
    image: Image.Image
    data: bytes | None

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size

    @property
    def format(self) -> str | None:
        return self.image.format

    @property
    def rows_in_order(self) -> bool:
        """A PNG decoded top to bottom in one pass (not interlaced): decoding can stop at a row."""
        img = self.image
        return (
            self.data is not None
            and img.format == "PNG"
            and len(img.tile) == 1
            and not img.info.get("interlace")
        )


def _too_large(name: str, exc: Image.DecompressionBombError) -> ImageTooLarge:
    """PIL's own size limit (the second line behind :func:`check_size`) as keyshot's one-line refusal."""
    return ImageTooLarge(name, f"over PIL's decompression-bomb limit: {exc}")


def _pil_open(data: bytes, name: str) -> Image.Image:
    """PIL's image of ``data`` opened for its header only, without PIL's decompression-bomb check (nothing
    is decoded here; :func:`check_size` is the check). Raises ImageError if no format fits."""
    Image.preinit()
    Image.init()
    prefix = data[:16]
    for fmt, (factory, accept) in Image.OPEN.items():
        if accept is None or accept(prefix):
            try:
                img = factory(io.BytesIO(data), "")
            except Image.DecompressionBombError as exc:  # a format whose opening checks the size
                raise _too_large(name, exc) from exc
            except _DECODE_ERRORS:
                continue
            img.format = img.format or fmt
            return img
    raise ImageError(name, "not an image file (PIL cannot identify its format)")


def read_header(src: Path | str | bytes | Image.Image) -> Header:
    """Read a screenshot's header (a path, encoded bytes or a PIL image); nothing is decoded.

    Raises :class:`ImageError` naming the source for a missing, empty or unidentifiable file.
    """
    if isinstance(src, Image.Image):
        return Header("<PIL image>", src, None)
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
        raise TypeError(f"a screenshot is a path, bytes or a PIL image, not {type(src).__name__}")
    if not data:
        raise ImageError(name, "empty file (0 bytes), not an image")
    return Header(name, _pil_open(data, name), data)


def jpeg_reduction(header: Header, crop: tuple[int, int], out: tuple[int, int]) -> int:
    """The DCT scale (1, 2, 4 or 8) a JPEG is decoded at: the largest that keeps the crop at least the
    output size (PIL's ``draft`` rule); 1 for anything else."""
    if header.format != "JPEG" or header.data is None:
        return 1
    (crop_w, crop_h), (out_w, out_h) = crop, out
    scale = 1
    while scale < 8 and out_w * scale * 2 <= crop_w and out_h * scale * 2 <= crop_h:
        scale *= 2
    return scale


def decoded_extent(header: Header, crop: tuple[int, int], out: tuple[int, int]) -> tuple[int, int]:
    """``(width, height)`` of what decoding ``header`` for a top-left ``crop`` produces: the crop's rows
    only for a PNG read in row order, the whole image (reduced, for a shrunk JPEG) otherwise; for a
    caller's PIL image (decoded already), the crop that is converted."""
    width, height = header.size
    if header.data is None:  # the caller's decoded image: only its crop is converted
        return crop
    if header.rows_in_order and crop[1] < height:
        return width, crop[1]
    scale = jpeg_reduction(header, crop, out)
    return math.ceil(width / scale), math.ceil(height / scale)


def check_size(header: Header, pixels: int) -> None:
    """Refuse (:class:`ImageTooLarge`, one line) a screenshot whose decode would exceed the limit."""
    if pixels <= MAX_DECODED_PIXELS:
        return
    width, height = header.size
    whole = "" if header.rows_in_order else f" (a {header.format or 'non-PNG'} image decodes whole)"
    raise ImageTooLarge(
        header.name,
        f"image of {width}×{height} pixels is too large for a screenshot: it decodes {pixels:,} pixels{whole}, "
        f"a screenshot at most {MAX_DECODED_PIXELS:,} (an 8K display is 33 M; a full page is decoded down "
        "to its 4:1 crop only, 59 M at 3840 px wide)",
    )


def decode_rgb(header: Header, crop: tuple[int, int], out: tuple[int, int]) -> np.ndarray:
    """The top-left ``crop`` of a screenshot as an ``(h, w, 3)`` uint8 RGB array (at the JPEG's reduced
    scale when shrinking allows it: see :func:`decoded_extent`). Errors name the source."""
    single_threaded_opencv()
    name, img, data = header.name, header.image, header.data
    if data is None:  # the caller's image: never change its mode or scale
        if crop != img.size:
            img = img.crop((0, 0, *crop))
        return np.asarray(to_rgb(img, name))
    width, height = header.size
    rows = crop[1] if header.rows_in_order and crop[1] < height else None  # a tall page: its top only
    try:
        if img.format == "PNG" and rows is None and img.tile and img.tile[0].args in _SPNG_MODES:
            pixels = _spng_rgb(data, img)
        elif img.format == "JPEG" and img.mode in {"RGB", "L"}:
            flags = _OPENCV_JPEG[jpeg_reduction(header, crop, out)] | cv2.IMREAD_IGNORE_ORIENTATION
            bgr = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
            if bgr is None:
                raise OSError("OpenCV cannot decode it")
            pixels = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        else:
            pixels = np.asarray(to_rgb(_pil_decode(header, rows, crop, out), name))
    except ImageError:
        raise
    except Image.DecompressionBombError as exc:  # PIL's own limit, the second line
        raise _too_large(name, exc) from exc
    except _DECODE_ERRORS as exc:
        raise ImageError(name, f"corrupt or truncated image: {exc}") from exc
    # the crop in the decoded image's coordinates (a JPEG decoded at a reduced scale is smaller)
    box_w = max(1, round(crop[0] * pixels.shape[1] / width))
    box_h = crop[1] if rows is not None else max(1, round(crop[1] * pixels.shape[0] / height))
    if (box_w, box_h) != (pixels.shape[1], pixels.shape[0]):
        pixels = pixels[:box_h, :box_w]
    return pixels


@contextmanager
def decoded(header: Header, crop: tuple[int, int], out: tuple[int, int]) -> Iterator[np.ndarray]:
    """The screenshot's top-left ``crop`` as RGB pixels (:func:`decode_rgb`), its size checked from the
    header first (:func:`check_size`) and its pixels held in :data:`DECODE_BUDGET` while the caller works
    on them: the one way a screenshot is decoded to be shown or sent."""
    pixels = math.prod(decoded_extent(header, crop, out))
    check_size(header, pixels)
    with DECODE_BUDGET.hold(pixels):
        yield decode_rgb(header, crop, out)


def decode_image(src: Path | str | bytes | Image.Image) -> Image.Image:
    """The whole screenshot (a path, encoded bytes or a PIL image) as an RGB PIL image, decoded the one
    way (:func:`decoded`: its size checked from the header first, its pixels drawn from the budget while
    they are decoded; transparency on white). A caller's PIL image is returned as it is. Errors (a refused
    size included) are :class:`ImageError` naming the source."""
    header = read_header(src)
    if header.data is None:
        return header.image
    with decoded(header, header.size, header.size) as rgb:
        return Image.fromarray(rgb)


def _spng_rgb(data: bytes, img: Image.Image) -> np.ndarray:
    """An 8-bit PNG through libspng; transparency (a tRNS key, or alpha not all opaque) goes to PIL's
    compositing so that both paths give the same pixels."""
    if "transparency" in img.info:
        return np.asarray(to_rgb(_pil_decode(Header("", img, data), None, img.size, img.size)))
    pixels = pyspng.load(data, _SPNG_MODES[img.tile[0].args])
    if pixels.shape[2] == 4:
        if pixels[..., 3].min() < 255:
            return np.asarray(_composite_on_white(Image.fromarray(pixels, "RGBA")))
        pixels = np.ascontiguousarray(pixels[..., :3])
    return pixels


def _pil_decode(header: Header, rows: int | None, crop: tuple[int, int], out: tuple[int, int]) -> Image.Image:
    """Decode with PIL: a PNG read in row order down to ``rows`` only, anything else whole (a JPEG at
    its reduced scale), with PIL's own decompression-bomb limit in force for whole decodes."""
    assert header.data is not None
    if rows is not None and rows < header.size[1]:
        img = _pil_open(header.data, header.name)  # a fresh reader: the header's is not consumed
        tile = img.tile[0]
        img._size = (img.size[0], rows)
        img.tile = [tile._replace(extents=(0, 0, img.size[0], rows))]
    else:
        img = Image.open(io.BytesIO(header.data))
        scale = jpeg_reduction(header, crop, out)
        if scale > 1:
            img.draft(None, (math.ceil(img.size[0] / scale), math.ceil(img.size[1] / scale)))
    img.load()
    return img


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
