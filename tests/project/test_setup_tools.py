"""The set-up's torchvision shim installer (tools/install_tv_shim.py): it installs the shim only where the
module does not import beside the installed torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.support import paths

REPO = paths.REPO


def _installer():
    spec = importlib.util.spec_from_file_location("install_tv_shim", REPO / "tools" / "install_tv_shim.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nothing_is_installed_where_the_module_imports(tmp_path):
    installer = _installer()
    assert installer.ensure_shim(tmp_path, module="json") is False
    assert list(tmp_path.iterdir()) == []


def test_the_shim_is_installed_where_the_module_does_not_import(tmp_path):
    installer = _installer()
    assert installer.ensure_shim(tmp_path, module="keyshot_no_such_module") is True
    pth = (tmp_path / installer.PTH_FILE).read_text()
    assert pth == "import _keyshot_tv_shim; _keyshot_tv_shim.activate()\n"
    shim = tmp_path / "_keyshot_tv_shim.py"
    assert shim.read_bytes() == (REPO / "tools" / "torchvision_cpu_shim.py").read_bytes()
    # the installed pair works: an interpreter that reads this site folder runs the hook at start
    probe = f"import site, sys; site.addsitedir({str(tmp_path)!r}); print('_keyshot_tv_shim' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


def test_the_probe_runs_with_the_shim_turned_off(tmp_path, monkeypatch):
    """The check is of torchvision as it is, not as an earlier shim makes it: KEYSHOT_TV_SHIM=0."""
    (tmp_path / "shim_switch_probe.py").write_text(
        "import os\nif os.environ.get('KEYSHOT_TV_SHIM') != '0':\n    raise ImportError('the shim is on')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("KEYSHOT_TV_SHIM", "1")
    assert _installer().imports("shim_switch_probe") is True
