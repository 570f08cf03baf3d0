"""Atomic file writes: readers see the old content or the new, never a part; files get the mode the
user's umask gives a new file (0644 under the usual 022), not the 0600 of a temporary file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))
