"""Atomic file writes: readers see the old content or the new, never a part; files get the mode the
user's umask gives a new file (0644 under the usual 022), not the 0600 of a temporary file. A whole
folder (a checkpoint, a dataset) is replaced the same way (:func:`replace_folder`)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from keyshot.infer.common.errors import KeyshotError

logger = logging.getLogger(__name__)


class OutputPathError(KeyshotError):
    """A file keyshot writes cannot be written: a folder stands at its path, a file where one of its
    folders goes, or the system refuses (permissions, a full disk)."""


def output_problem(path: Path, exc: OSError, *, folder: bool = False) -> OutputPathError:
    """The one-line error for ``path`` (a file, or with ``folder`` a folder) that could not be made."""
    if not folder and path.is_dir():
        return OutputPathError(
            f"{path}: is a folder where keyshot writes a file: move it away or choose another output "
            "folder, then re-run"
        )
    candidates = [path, *path.parents] if folder else list(path.parents)
    in_the_way = next((p for p in candidates if _not_a_folder(p)), None)
    if in_the_way is not None:
        needed = "" if in_the_way == path else f" (to write {path})"
        return OutputPathError(
            f"{in_the_way}: is a file where keyshot needs a folder{needed}: move it away or choose "
            "another output path, then re-run"
        )
    return OutputPathError(
        f"{path}: cannot write ({exc.strerror or exc}): check the folder's permissions and free space"
    )


def _not_a_folder(path: Path) -> bool:
    return (path.exists() or path.is_symlink()) and not path.is_dir()


def make_folder(path: str | os.PathLike) -> Path:
    """``mkdir -p path``; a file in the way raises OutputPathError naming it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_problem(path, exc, folder=True) from exc
    return path


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike, mode: str = "wb", encoding: str | None = None, *, sync: bool = False
) -> Iterator[IO]:
    """A file handle on a temporary sibling of ``path``, renamed into place when the block ends; left out
    (``path`` untouched) when it raises. The one way keyshot writes a whole file. A folder at ``path``
    or a file where a folder of it goes raises OutputPathError naming it. ``sync`` also flushes
    it to the disk first (a merge's result; not the report's thousands of pages)."""
    path = Path(path)
    make_folder(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise output_problem(path, exc) from exc
    try:
        with os.fdopen(fd, mode, encoding=encoding) as fh:
            yield fh
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, _file_mode())
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise output_problem(path, exc) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_output(path) as fh:
        fh.write(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def torn_tail(path: str | os.PathLike) -> bool:
    """True when the append-only file ``path`` ends in a half-written line (its writer was killed)."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        return False
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        return fh.read(1) != b"\n"


def cut_torn_tail(path: str | os.PathLike, consequence: str = "") -> int:
    """Cut a half-written last line off ``path`` so the next append starts on a fresh line, with a warning
    that ends in ``consequence`` (what happens to the record it held); returns the number of bytes removed
    (0 when the file ends with a newline, is empty or is missing)."""
    path = Path(path)
    if not path.exists() or not torn_tail(path):
        return 0
    with open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        end, keep = size, 0
        while end > 0:  # scan back for the last newline, a block at a time
            start = max(0, end - 65536)
            fh.seek(start)
            cut = fh.read(end - start).rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        fh.truncate(keep)
    logger.warning(
        "%s: the last line (%d bytes) is incomplete, left by an interrupted run; removing it%s",
        path,
        size - keep,
        f" ({consequence})" if consequence else "",
    )
    return size - keep


#: What a folder being replaced is renamed to beside it (``.NAME.replaced``) until the new one is in.
REPLACED = ".replaced"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def replace_folder(new: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Put the complete folder ``new`` at ``path`` (on the same file system), replacing what is there, so
    that a reader or a crash at any instant finds the old folder or the new one whole. The one way keyshot
    replaces a folder (a checkpoint, a dataset).

    Where the system exchanges two names in one step (Linux's ``renameat2`` with ``RENAME_EXCHANGE``),
    ``path`` is never missing: the two are exchanged, then the old one is renamed aside
    (``.NAME.replaced``) and removed. Elsewhere the old one is renamed aside first, the new one in, then
    the old one removed: a crash between the two renames leaves only the old one, aside, which
    :func:`recover_folder` (run here first, and by readers of such folders) puts back."""
    new, path = Path(new), Path(path)
    recover_folder(path)
    aside = _aside(path)
    if not path.exists():
        os.replace(new, path)
    elif _exchange(new, path):
        os.replace(new, aside)  # the old folder, now at the new one's name
    else:
        os.replace(path, aside)
        os.replace(new, path)
    shutil.rmtree(aside, ignore_errors=True)
    return path


def recover_folder(path: str | os.PathLike) -> bool:
    """Undo what a crash inside :func:`replace_folder` left at ``path``: the old folder alone, aside, goes
    back; an old folder aside of a folder that is in place is removed. Whether anything was there."""
    path = Path(path)
    aside = _aside(path)
    if not aside.is_dir():
        return False
    if path.exists():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        logger.warning("%s: a replacement was interrupted; the previous folder is put back", path)
        os.replace(aside, path)
    return True


def recover_folders(parent: str | os.PathLike) -> None:
    """:func:`recover_folder` for every folder of ``parent`` a crash left aside."""
    parent = Path(parent)
    if parent.is_dir():
        for aside in parent.glob(f".*{REPLACED}"):
            recover_folder(parent / aside.name[1 : -len(REPLACED)])


def _aside(path: Path) -> Path:
    return path.with_name(f".{path.name}{REPLACED}")


def _exchange(a: Path, b: Path) -> bool:
    """Exchange the folders at ``a`` and ``b`` in one step; False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc 2.28+, or not Linux
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):  # this file system cannot
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))
