"""Print keyshot's dependencies from pyproject.toml, one a line: the core ones, or those of an extra.

The set-up scripts install them into venvs that are not built from keyshot's own install (the RL
frameworks' venvs, the browser extra), so the list lives in one place:

    python3.11 tools/pyproject_deps.py            # [project].dependencies
    python3.11 tools/pyproject_deps.py browser    # [project.optional-dependencies].browser
"""

import sys
from pathlib import Path

import tomllib

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
extra = sys.argv[1] if len(sys.argv) > 1 else None
print(*(project["optional-dependencies"][extra] if extra else project["dependencies"]), sep="\n")
