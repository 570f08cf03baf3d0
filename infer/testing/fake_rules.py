"""The teachers' scoring rules: a 1-5 score that is a real function of a screenshot's pixels, and the
stable hash that picks which requests get a given kind of answer."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
from PIL import Image


def _bucket(value: float) -> int:
    """Map a value in [0, 1] to a score 1..5."""
    return 1 + min(4, max(0, int(value * 5)))


def _brightness(img: Image.Image) -> tuple[int, str]:
    mean = float(np.asarray(img.convert("L"), dtype=np.float32).mean())
    return _bucket(
        mean / 255.0
    ), f"The page is mostly {'light' if mean >= 128 else 'dark'} (mean brightness {mean:.1f} of 255)."


def _darkness(img: Image.Image) -> tuple[int, str]:
    mean = float(np.asarray(img.convert("L"), dtype=np.float32).mean())
    return _bucket(1.0 - mean / 255.0), f"The page has a darkness of {255 - mean:.1f} of 255."


def _colour_fraction(img: Image.Image, channel: int) -> float:
    arr = np.asarray(img.convert("RGB"), dtype=np.int16)
    main = arr[..., channel]
    others = np.delete(arr, channel, axis=2)
    return float(((main > 150) & (others < 100).all(axis=2)).mean())


def _red_fraction(img: Image.Image) -> tuple[int, str]:
    frac = _colour_fraction(img, 0)
    return _bucket(frac * 2), f"About {frac:.0%} of the page is strongly red."


def _blue_fraction(img: Image.Image) -> tuple[int, str]:
    frac = _colour_fraction(img, 2)
    return _bucket(frac * 2), f"About {frac:.0%} of the page is strongly blue."


SCORE_RULES: dict[str, Callable[[Image.Image], tuple[int, str]]] = {
    "brightness": _brightness,
    "darkness": _darkness,
    "red_fraction": _red_fraction,
    "blue_fraction": _blue_fraction,
}


def score_image(rule: str, img: Image.Image) -> int:
    """The 1..5 score a teacher with ``rule`` gives ``img`` (for tests to compute expectations)."""
    if rule not in SCORE_RULES:
        raise ValueError(f"unknown scoring rule {rule!r}; choose one of {', '.join(SCORE_RULES)}")
    return SCORE_RULES[rule](img)[0]


def stable_fraction(data: bytes, seed: int = 0) -> float:
    """A deterministic number in [0, 1) derived from ``data`` and ``seed``."""
    digest = hashlib.sha256(seed.to_bytes(8, "little", signed=True) + data).digest()
    return int.from_bytes(digest[:8], "little") / 2**64
