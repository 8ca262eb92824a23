"""CITATION.cff: Citation File Format 1.2.0 with the required keys, and the package's version."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import fedbench

ROOT = Path(__file__).resolve().parents[1]
CITATION = ROOT / "CITATION.cff"
REQUIRED = ("cff-version", "message", "title", "authors")  # CFF 1.2.0's required keys


def _unquote(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" else text


def read_cff(text: str) -> dict:
    """The block-YAML subset CITATION.cff is written in: `key: value` lines, and `key:` followed by
    `  - item` or `  - name: value` items; comments and blank lines skipped. Anything else is an error,
    so the file cannot drift into YAML this reader (and the test) misreads."""
    out: dict = {}
    key = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if item := re.fullmatch(r"  - (?:([\w-]+): )?(.+)", line):
            assert key is not None and isinstance(out[key], list), line
            out[key].append({item[1]: _unquote(item[2])} if item[1] else _unquote(item[2]))
        elif pair := re.fullmatch(r"([\w-]+):(?: (.+))?", line):
            key = pair[1]
            assert key not in out, f"{key} twice"
            out[key] = _unquote(pair[2]) if pair[2] else []
        else:
            raise AssertionError(f"CITATION.cff: a line outside the subset: {line!r}")
    return out


def test_citation_has_the_required_keys_and_the_package_version():
    cff = read_cff(CITATION.read_text(encoding="utf-8"))
    assert all(cff.get(k) for k in REQUIRED), cff
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["title"] == "fedbench"
    assert cff["authors"] == [{"name": "fedbench contributors"}]
    assert cff["license"] == "MIT" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", cff["date-released"])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert cff["version"] == project["version"] == fedbench.__version__
    assert cff["license"] == project["license"]


def test_citation_parses_as_yaml_to_the_same_data():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    data = yaml.safe_load(CITATION.read_text(encoding="utf-8"))
    parsed = read_cff(CITATION.read_text(encoding="utf-8"))
    assert {k: str(v) if k in ("cff-version", "version") else v for k, v in data.items()} == parsed
