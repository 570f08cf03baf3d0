"""Helpers shared by the trajectory loaders: JSON reading, field checks, screenshot references, and
the input scope (:class:`InputScope`): keyshot reads nothing outside the input the user named."""

from __future__ import annotations

import base64
import binascii
import errno
import json
import logging
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyshot.infer.loaders.trajectory import OnError, Screenshot, SkippedEntry, TrajectoryError
from keyshot.infer.protocol.images import sniff_image_type

logger = logging.getLogger(__name__)

#: File extensions taken as screenshots (case-insensitive); anything else in a screenshot folder is skipped.
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"})

_FIRST_INT = re.compile(r"\d+")
_DATA_URL = re.compile(
    r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,(?P<data>.*)$", re.DOTALL
)
_BASE64_TEXT = re.compile(r"^[A-Za-z0-9+/\s]+={0,2}\s*$")


@dataclass(frozen=True)
class InputScope:
    """The folders trajectory files may point into: the input the user named (plus ``--allow-outside``).

    A screenshot reference that resolves (symlinks followed) outside every root is refused, so a
    downloaded trajectory cannot make keyshot read, and send to a remote judge, a local file.
    """

    roots: tuple[Path, ...]

    @classmethod
    def of(cls, *paths: Path | str, allow_outside: Iterable[Path | str] = ()) -> InputScope:
        roots = []
        for p in (*paths, *allow_outside):
            p = Path(p)
            roots.append(_real(p if p.is_dir() or not p.exists() else p.parent))
        return cls(tuple(roots))

    def contains(self, path: Path) -> bool:
        resolved = _real(path)
        return any(resolved == root or resolved.is_relative_to(root) for root in self.roots)

    def holding(self, folder: Path) -> InputScope:
        """The scope of a trajectory folder the input holds: a folder reached through a link in the input
        (``keyshot reward filter --link`` writes such links) adds its target, so its own screenshots are
        read; a reference in it that leads anywhere else is still refused."""
        if self.contains(folder):
            return self
        return InputScope((*self.roots, _real(folder)))

    def check(self, path: Path, source: Path, what: str, line: int | None = None) -> None:
        if not self.contains(path):
            resolved = _real(path)
            shown = (
                f"{path}, which resolves to {resolved}" if resolved != Path(os.path.abspath(path)) else path
            )
            raise TrajectoryError(
                source,
                f"{what} ({shown}) is outside the input ({', '.join(map(str, self.roots))}); keyshot reads "
                "nothing outside the input you named: pass --allow-outside DIR to allow that folder",
                line,
            )


def _real(path: Path) -> Path:
    """``path`` with every symlink followed; a symlink loop is left as it is (opening it fails, by name)
    where ``Path.resolve`` raises RuntimeError."""
    return Path(os.path.realpath(path))


def os_problem(exc: OSError) -> str:
    """Why the operating system refused a path, in words (a symlink loop is named as one)."""
    if exc.errno == errno.ELOOP:
        return "a symlink loop (the link points, through other links, back to itself)"
    return exc.strerror or str(exc)


def account_for(exc: TrajectoryError, on_error: OnError, errors: list[TrajectoryError] | None) -> None:
    """A trajectory or input entry that is not judged: raised (``on_error="raise"``, except for a
    skipped entry, which is only warned of), else appended to ``errors``, whose caller says it (keyshot
    judge lists each under "not loaded" and in its summary: one line, once), or, without ``errors``,
    logged as a warning."""
    if on_error == "raise" and not isinstance(exc, SkippedEntry):
        raise exc
    logger.log(
        logging.DEBUG if errors is not None else logging.WARNING,
        "skipping %s: %s",
        "an input entry" if isinstance(exc, SkippedEntry) else "a trajectory",
        exc,
    )
    if errors is not None:
        errors.append(exc)


def require_regular_file(path: Path, what: str = "file") -> None:
    """Refuse, without opening it, anything that is not a regular file (a FIFO would hang the run)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError as exc:
        raise TrajectoryError(
            path, f"{what} is missing" + (" (a dangling symlink)" if path.is_symlink() else "")
        ) from exc
    except OSError as exc:
        raise TrajectoryError(path, f"cannot read {what}: {os_problem(exc)}") from exc
    if not stat.S_ISREG(mode):
        raise TrajectoryError(path, f"{what} is not a regular file (a folder, FIFO or device); not read")


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing, unreadable or malformed file raises TrajectoryError naming it."""
    require_regular_file(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise TrajectoryError(path, "file is missing") from exc
    except UnicodeDecodeError as exc:
        raise TrajectoryError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise TrajectoryError(path, f"cannot read file: {os_problem(exc)}") from exc
    return parse_json(text, path)


def parse_json(text: str, path: Path, line: int | None = None) -> Any:
    """Parse JSON text read from ``path`` (``line``: of a JSONL file); malformed or absurdly deeply
    nested JSON raises TrajectoryError naming the file (and line)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if line is not None else f"line {exc.lineno}, column {exc.colno}"
        raise TrajectoryError(path, f"invalid JSON: {exc.msg} ({where})", line) from exc
    except RecursionError as exc:
        raise TrajectoryError(
            path, "JSON nested too deeply to read (thousands of levels of lists or objects); not read", line
        ) from exc


def first_int(name: str) -> int | None:
    """The first run of digits in a file name (``"12_full_screenshot.png"`` → 12), or None."""
    match = _FIRST_INT.search(name)
    return int(match.group()) if match else None


def is_image_name(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_EXTENSIONS


def require_str(
    data: dict, key: str, path: Path, line: int | None = None, *, allow_empty: bool = False
) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        found = "missing" if key not in data else f"a {type(value).__name__}"
        raise TrajectoryError(path, f"field {key!r} must be a string, found {found}", line)
    if not allow_empty and not value.strip():
        raise TrajectoryError(path, f"field {key!r} is empty", line)
    return value


def optional_str(data: dict, key: str, path: Path, line: int | None = None) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise TrajectoryError(
        path, f"field {key!r} must be a string or null, found a {type(value).__name__}", line
    )


def string_list(
    value: Any, key: str, path: Path, line: int | None = None, *, none_as_empty: bool = False
) -> list[str]:
    """A JSON list of strings (``None`` items become ``""`` when ``none_as_empty``)."""
    if not isinstance(value, list):
        raise TrajectoryError(
            path, f"field {key!r} must be a list of strings, found a {type(value).__name__}", line
        )
    out: list[str] = []
    for i, item in enumerate(value):
        if item is None and none_as_empty:
            item = ""
        if not isinstance(item, str):
            raise TrajectoryError(path, f"{key}[{i}] must be a string, found a {type(item).__name__}", line)
        out.append(item)
    return out


def align_thoughts(thoughts: list[str] | None, actions: list[str], path: Path) -> list[str] | None:
    """Thoughts aligned one-to-one with actions: missing ones become "" and extra ones are dropped (warned)."""
    if not thoughts:
        return None
    if len(thoughts) != len(actions):
        logger.warning(
            "%s: %d thoughts for %d actions; aligning by position (missing thoughts left empty, extra dropped)",
            path,
            len(thoughts),
            len(actions),
        )
        thoughts = (thoughts + [""] * len(actions))[: len(actions)]
    return thoughts


def check_counts(actions: list[str], screenshots: list[Screenshot], path: Path) -> None:
    """Warn when actions and screenshots differ by more than one.

    One screenshot per action, or one more (the page after the last action), are both normal. A larger
    gap usually means dropped frames; the trajectory is still judged (WebJudge scores screenshots and
    reads the action list independently), but the user is told.
    """
    if abs(len(actions) - len(screenshots)) > 1:
        logger.warning(
            "%s: %d actions but %d screenshots (expected equal counts or one more screenshot); judging it anyway",
            path,
            len(actions),
            len(screenshots),
        )


def screenshot_file(
    path: Path, index: int, source: Path, line: int | None = None, scope: InputScope | None = None
) -> Screenshot:
    """A screenshot on disk; missing, zero-byte and non-regular files, and files outside ``scope``,
    raise TrajectoryError at load time (nothing is opened to tell).

    The error names the image; for a JSONL record (``line`` given) it starts with ``source:line``.
    """

    def error(problem: str) -> TrajectoryError:
        if line is None:
            return TrajectoryError(path, problem)
        return TrajectoryError(source, f"screenshot {index} ({path}): {problem}", line)

    if scope is not None and not scope.contains(path):
        scope.check(path, source, f"screenshot {index}", line)
    try:
        st = path.stat()
    except FileNotFoundError as exc:
        raise error(f"screenshot file is missing (referenced by {source})") from exc
    except OSError as exc:
        raise error(f"cannot read screenshot: {os_problem(exc)}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise error("screenshot is not a regular file (a folder, FIFO or device); not read")
    size = st.st_size
    if size == 0:
        raise error("screenshot file is empty (0 bytes)")
    return Screenshot(path=path, index=index)


#: Bare base64 text at least this long is an embedded screenshot (shorter text only when it decodes to an
#: image's signature, so that a mistyped file name is reported as a missing file).
MIN_BASE64_CHARS = 256
#: The longest text taken for a file name (Linux's PATH_MAX); longer text, or text over several lines,
#: names no file.
MAX_PATH_CHARS = 4096


def ref_file(ref: str, bases: list[Path]) -> Path | None:
    """The existing file (or link) a screenshot reference names: ``ref`` itself when absolute, else the
    first of ``bases`` where it exists; None when it names none (text that cannot be a file name, base64
    data among it, included)."""
    if "\n" in ref or len(ref) > MAX_PATH_CHARS or ref.startswith(("data:", "http://", "https://")):
        return None
    for candidate in _candidates(ref, bases):
        try:
            if candidate.exists() or candidate.is_symlink():
                return candidate
        except OSError:  # a component longer than a file name can be: base64 text, not a file
            continue
    return None


def _candidates(ref: str, bases: list[Path]) -> list[Path]:
    return [Path(ref)] if Path(ref).is_absolute() else [base / ref for base in bases]


def screenshot_from_ref(
    ref: str,
    index: int,
    bases: list[Path],
    source: Path,
    line: int | None = None,
    scope: InputScope | None = None,
) -> Screenshot:
    """Resolve a screenshot reference: the one rule for a screenshot given as text, in trajectory files,
    reward rollouts and episodes alike.

    An existing file (absolute, or relative to the first of ``bases`` where it exists:
    :func:`ref_file`) is that file, refused when it resolves outside ``scope`` (default: the first base);
    otherwise the text is read by :func:`embedded_data` (a data URL, bare base64; a remote URL is
    refused); anything else is a missing file.
    """
    scope = scope or InputScope.of(bases[0])
    ref = ref.strip()
    if not ref:
        raise TrajectoryError(source, f"screenshot {index} is an empty string", line)
    found = ref_file(ref, bases)
    if found is not None:
        scope.check(found, source, f"screenshot {index} {_shown(ref)!r}", line)
        return screenshot_file(found, index, source, line, scope)
    data = embedded_data(ref, index, source, line)
    if data is not None:
        return Screenshot(path=source, index=index, data=data)
    candidates = [] if "\n" in ref or len(ref) > MAX_PATH_CHARS else _candidates(ref, bases)
    for candidate in candidates:
        scope.check(candidate, source, f"screenshot {index} {ref!r}", line)
    tried = ", ".join(str(c) for c in candidates) or "no file: the text cannot be a file name"
    raise TrajectoryError(source, f"screenshot {index} not found: {_shown(ref)!r} (looked for {tried})", line)


def embedded_data(ref: str, index: int, source: Path, line: int | None = None) -> bytes | None:
    """The image bytes a screenshot reference carries in itself, or None when it carries none (a file
    name). A ``data:...;base64,`` URL is its data; bare base64 text (:data:`MIN_BASE64_CHARS` long, or
    shorter decoding to a PNG, JPEG, WebP or GIF signature) is its data. Raises TrajectoryError for a
    data URL without base64 data, invalid base64 and a remote URL (keyshot never downloads screenshots).
    """
    ref = ref.strip()
    if ref.startswith("data:"):
        match = _DATA_URL.match(ref)
        if not match:
            raise TrajectoryError(source, f"screenshot {index} is a data URL without ';base64,' data", line)
        return _b64decode(match.group("data"), index, source, line)
    if ref.startswith(("http://", "https://")):
        raise TrajectoryError(
            source,
            f"screenshot {index} is a remote URL ({ref[:80]}); download screenshots and reference files",
            line,
        )
    if not _BASE64_TEXT.match(ref):
        return None
    if len(ref) >= MIN_BASE64_CHARS:
        return _b64decode(ref, index, source, line)
    return _image_b64(ref)


def data_url_bytes(url: str) -> bytes | None:
    """The bytes a ``data:...;base64,`` URL carries (None for anything else, or invalid base64)."""
    match = _DATA_URL.match(url.strip())
    if not match:
        return None
    try:
        return base64.b64decode("".join(match.group("data").split()), validate=True)
    except (binascii.Error, ValueError):
        return None


def _image_b64(text: str) -> bytes | None:
    """The bytes of short base64 text that decodes to an image's signature, else None."""
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if sniff_image_type(data)[0] != "application/octet-stream" else None


def _shown(text: str) -> str:
    """Text as an error may quote it: at most 80 characters (base64 data is never echoed whole)."""
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


def _b64decode(text: str, index: int, source: Path, line: int | None) -> bytes:
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TrajectoryError(source, f"screenshot {index}: invalid base64 data ({exc})", line) from exc
    if not data:
        raise TrajectoryError(source, f"screenshot {index}: embedded image is empty", line)
    return data
