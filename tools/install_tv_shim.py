"""Install tools/torchvision_cpu_shim.py into the running interpreter's site-packages, where it is needed.

Usage: VENV/bin/python tools/install_tv_shim.py

It is needed only where ``import torchvision`` fails beside the installed torch (PyPI's CUDA-built
torchvision beside a ``+cpu`` torch); where torchvision imports as it is (a matching CPU or CUDA pair),
nothing is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

SHIM = Path(__file__).with_name("torchvision_cpu_shim.py")
SHIM_MODULE = "_keyshot_tv_shim"
PTH_FILE = "keyshot_tv_shim.pth"


def imports(module: str, python: str = sys.executable) -> bool:
    """Whether ``python -c "import MODULE"`` succeeds, with any installed shim turned off."""
    env = {**os.environ, "KEYSHOT_TV_SHIM": "0"}
    done = subprocess.run([python, "-c", f"import {module}"], env=env, capture_output=True, timeout=600)
    return done.returncode == 0


def install(site: Path) -> None:
    """Copy the shim into ``site`` with the ``.pth`` line that activates it at interpreter start."""
    shutil.copy(SHIM, site / f"{SHIM_MODULE}.py")
    (site / PTH_FILE).write_text(f"import {SHIM_MODULE}; {SHIM_MODULE}.activate()\n")


def ensure_shim(site: Path, python: str = sys.executable, module: str = "torchvision") -> bool:
    """Install the shim into ``site`` unless ``module`` imports there as it is; True when installed."""
    if imports(module, python):
        return False
    install(site)
    return True


def main() -> int:
    site = Path(sysconfig.get_paths()["purelib"])
    if ensure_shim(site):
        print(f"torchvision CPU shim installed in {site} (torchvision does not import beside this torch)")
    else:
        print("torchvision imports beside the installed torch: no shim needed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
