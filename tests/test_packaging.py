"""Packaging: every subpackage is declared, presets ship with the package, the CLI starts without torch."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_declared():
    """Data folders too: Python imports any folder, so setuptools counts them as packages and prints a
    page of warnings per undeclared one on `pip install` (their files still need `package-data`)."""
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "fedbench").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert "fedbench.data.files" in found and "fedbench.reporting.templates" in found
    assert found - declared == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_every_data_file_is_package_data():
    """Each non-Python file under fedbench/ is matched by its folder's `package-data` globs, so the
    wheel ships it (a declared folder without them installs empty)."""
    from fnmatch import fnmatch

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = [
        p
        for p in (ROOT / "fedbench").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert any(p.name == "site.css" for p in data)
    missing = [
        p.relative_to(ROOT).as_posix()
        for p in data
        if not any(fnmatch(p.name, g) for g in globs.get(".".join(p.parent.relative_to(ROOT).parts), []))
    ]
    assert missing == [], "add them to [tool.setuptools.package-data] in pyproject.toml"


def test_license_is_an_spdx_expression_the_build_backend_reads():
    """A TOML-table license makes setuptools print a deprecation page three times per `pip install`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT"
    assert "setuptools>=77" in project["build-system"]["requires"]  # SPDX `license` needs 77


def test_builtin_presets_resolve_through_the_package():
    from fedbench.spec.grid import builtin_preset_dir

    assert (builtin_preset_dir() / "quickstart.toml").is_file()


def test_listing_does_not_import_torch():
    code = (
        "import sys; from fedbench.registry import load_builtins, unavailable; load_builtins(); "
        "import fedbench.cli; assert not unavailable(), unavailable(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", "a plugin module imports torch at import time (slow CLI)"


@pytest.mark.parametrize("args", [["--help"], ["list"]])
def test_help_and_list_do_not_import_torch(args):
    """What keeps them fast (0.16 s and 0.37 s against 1.3 s for `import torch`; `benchmarks/bench_cli.py`
    times them): the commands themselves, run as the console script runs them, never import torch."""
    code = (
        "import atexit, runpy, sys; "
        "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
        f"sys.argv = ['fedbench', *{args!r}]; runpy.run_module('fedbench', run_name='__main__')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "torch imported: False"
