"""Each package's docstring is its map: it names every module and sub-package it holds, so
a reader finds a thing without opening every file (and a new module is noticed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "localinfer"
PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


def members(package: Path) -> list[str]:
    """The package's modules as ``name.py`` and its sub-packages as ``name/``."""
    modules = [f"{p.name}" for p in package.glob("*.py") if p.name != "__init__.py"]
    subpackages = [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()]
    return sorted(modules + subpackages)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_the_package_docstring_names_every_module(package: Path):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
    assert doc, f"{package.name}/__init__.py has no docstring"
    missing = [m for m in members(package)
               if not re.search(rf"(?<![\w./]){re.escape(m)}(?![\w])", doc)]
    assert missing == [], f"name these in {package.name}/__init__.py's docstring, one line each"


def test_the_maps_name_no_module_that_is_gone():
    for package in PACKAGES:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
        named = set(re.findall(r"(?<![\w./])(\w+\.py)\b", doc or ""))
        gone = sorted(n for n in named if not (package / n).exists()
                      and not list(PACKAGE.rglob(n)))
        assert gone == [], (package.name, gone)
