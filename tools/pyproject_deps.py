"""Print keyshot's dependencies from pyproject.toml, one a line: the core ones, or those of an extra; or
the pins of named packages in .ci/constraints-cpu.txt (the CPU torch build, the one home of its version).

The set-up scripts install them into venvs that are not built from keyshot's own install (the RL
frameworks' venvs, the browser extra, vLLM's), so each list lives in one place:

    python3.11 tools/pyproject_deps.py            # [project].dependencies
    python3.11 tools/pyproject_deps.py browser    # [project.optional-dependencies].browser
    python3.11 tools/pyproject_deps.py --cpu-pins torch torchvision   # torch==2.13.0+cpu, torchvision==...
"""

import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / ".ci" / "constraints-cpu.txt"


def cpu_pins(names: list[str]) -> list[str]:
    """The ``name==version`` lines of ``names`` in the CPU constraints, in the order asked; a name the file
    does not pin stops the set-up with one line."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.-]+)==\S+", line.strip()):
            pins[match.group(1).lower()] = match.group(0)
    missing = [n for n in names if n.lower() not in pins]
    if missing:
        sys.exit(f"tools/pyproject_deps.py: {CONSTRAINTS} pins no {', '.join(missing)}")
    return [pins[n.lower()] for n in names]


if len(sys.argv) > 1 and sys.argv[1] == "--cpu-pins":
    print(*cpu_pins(sys.argv[2:]), sep="\n")
else:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = sys.argv[1] if len(sys.argv) > 1 else None
    print(*(project["optional-dependencies"][extra] if extra else project["dependencies"]), sep="\n")
