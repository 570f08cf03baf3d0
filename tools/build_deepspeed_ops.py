"""Build DeepSpeed's CPU communication op once, where every later launch finds it (`make setup`).

DeepSpeed JIT-compiles its shared-memory collective (``deepspeed_shm_comm``) the first time a multi-process
run starts on a CPU: about 50 CPU seconds of g++ in the first ZeRO launch of every fresh extension folder.
This builds it into ``TORCH_EXTENSIONS_DIR`` (default: ``torch-extensions`` inside this environment, which
tests/train/test_launches.py points its launches at); a CPU launch of yours finds it with
``export TORCH_EXTENSIONS_DIR=.venv/torch-extensions``. A GPU machine builds its own ops: nothing to do
there, and none is built where the accelerator is not the CPU.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

#: where the op is built when ``TORCH_EXTENSIONS_DIR`` is not set: inside this environment
EXTENSIONS_DIR = Path(sys.prefix) / "torch-extensions"


def main() -> int:
    folder = os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        print(f"accelerator {accelerator.device_name()}: its ops are built where it runs; nothing to do")
        return 0
    builder = accelerator.create_op_builder("ShareMemCommBuilder")
    if builder is None:
        print("this DeepSpeed has no shared-memory op for the CPU; nothing to build")
        return 0
    start = time.monotonic()
    builder.load()
    print(f"{builder.NAME} ready in {folder} ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
