"""Screenshots made up for tests and benches: an image encoded as a file's bytes, a plain page, a page of
random pixels."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def encoded(image: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    """``image`` as the bytes of a ``fmt`` file (PIL's writer; ``params`` go to it: ``quality=90``,
    ``compress_level=1``, ``transparency=...``)."""
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def png(width: int, height: int, colour: tuple[int, int, int] = (240, 240, 240)) -> bytes:
    """A PNG of one colour: a page of that size, as small as a PNG of it gets."""
    return encoded(Image.new("RGB", (width, height), colour))


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    """An RGB image of random pixels, the same for the same ``seed``: a page no encoder shrinks much."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)
