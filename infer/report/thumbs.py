"""Screenshot copies for the report: a thumbnail (≤ 320 px wide) and a view size (≤ 1280 px wide),
JPEG, named by the image's content hash so that one image is converted once however often it
appears (dedup within a trajectory, the same page across runs) and a rebuilt report converts
nothing it already has.

The cache index (``index.json``) maps a hash of (path, size, mtime) to the content hash, so a rebuild
does not even read unchanged screenshots, and the shared report holds no path of the machine it was
built on.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from keyshot.infer.common.fileio import write_bytes_atomic, write_text_atomic
from keyshot.infer.protocol.decode import decoded, read_header
from keyshot.infer.protocol.images import DEFAULT_POLICY, kept_size

logger = logging.getLogger(__name__)

THUMB_WIDTH = 320
VIEW_WIDTH = 1280
INDEX_FILE = "index.json"
#: The tall-page rule of keyshot's image policy, applied to the report's copies.
TALL_PAGE_ASPECT = DEFAULT_POLICY.max_aspect
_HEX_KEY = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class ShotImages:
    """Paths relative to the report folder, and the image's content hash."""

    digest: str
    thumb: str
    view: str


class ThumbnailCache:
    """``images/<sha>.t.jpg`` and ``images/<sha>.v.jpg`` under the report folder."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.folder = out_dir / "images"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index_path = self.folder / INDEX_FILE
        self._index = _read_index(self._index_path)
        self.converted = 0
        self.reused = 0

    def images(self, path: Path | None, data: bytes | None = None) -> ShotImages | None:
        """The copies of one screenshot (a file, or embedded ``data``); None when it cannot be read."""
        try:
            if data is None:
                assert path is not None
                st = path.stat()
                stamp = _stamp(path, st)
                digest = self._index.get(stamp)
                if digest is None:
                    data = path.read_bytes()
                    digest = hashlib.sha256(data).hexdigest()[:32]
                    self._index[stamp] = digest
            else:
                digest = hashlib.sha256(data).hexdigest()[:32]
        except OSError as exc:
            logger.warning("report: cannot read screenshot %s (%s)", path, exc.strerror or exc)
            return None
        thumb, view = self.folder / f"{digest}.t.jpg", self.folder / f"{digest}.v.jpg"
        if thumb.exists() and view.exists():
            self.reused += 1
        else:
            try:
                self._convert(data if data is not None else path.read_bytes(), thumb, view)  # type: ignore[union-attr]
            except (OSError, ValueError) as exc:  # ImageError (a ValueError): PIL's bomb limit included
                logger.warning("report: cannot decode screenshot %s (%s)", path, exc)
                return None
            self.converted += 1
        rel = os.path.relpath(self.folder, self.out_dir)
        return ShotImages(digest, f"{rel}/{thumb.name}", f"{rel}/{view.name}")

    def _convert(self, data: bytes, thumb: Path, view: Path) -> None:
        """Both copies, decoded through the protocol's decoder: the header is checked first (an image no
        screenshot can be is refused, not decoded), the pixels held in the process-wide budget, a JPEG
        decoded at the scale the view needs, transparency on white as the judge sees it."""
        header = read_header(data)
        src_w, src_h = header.size
        shown = (min(src_w, VIEW_WIDTH), max(1, round(src_h * min(src_w, VIEW_WIDTH) / src_w)))
        with decoded(header, header.size, shown) as rgb:
            img = Image.fromarray(rgb)
            for target, width, quality in ((view, VIEW_WIDTH, 82), (thumb, THUMB_WIDTH, 75)):
                scaled = img
                if img.width > width:
                    # a very tall full page is cut by the policy's tall-page rule (kept_size: its top
                    # 4:1), so a thumbnail stays readable and shows the part the judge is shown
                    crop_w, crop_h = kept_size(img.width, img.height, TALL_PAGE_ASPECT)
                    height = max(1, round(crop_h * width / crop_w))
                    crop = img.crop((0, 0, crop_w, crop_h))
                    scaled = crop.resize((width, height), Image.Resampling.BILINEAR, reducing_gap=2.0)
                _write_jpeg(scaled, target, quality)

    def save_index(self) -> None:
        write_text_atomic(self._index_path, json.dumps(self._index))


def _stamp(path: Path, st: os.stat_result) -> str:
    """The index key of a screenshot file as it is now: a hash, so that no machine path is written."""
    return hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]


def _read_index(path: Path) -> dict[str, str]:
    """The saved index; entries of an older report keyed by the machine path itself are dropped."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict):
        return {}
    return {k: v for k, v in saved.items() if _HEX_KEY.fullmatch(k) and isinstance(v, str)}


def _write_jpeg(img: Image.Image, target: Path, quality: int) -> None:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    write_bytes_atomic(target, buf.getvalue())
