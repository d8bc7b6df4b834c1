"""The architecture's rules: the core imports no UI or web framework, and only runtime/
imports llama_cpp (checked in the source, and in a fresh interpreter)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "localinfer"
CORE = ["localinfer.hardware", "localinfer.gguf", "localinfer.catalog", "localinfer.planner",
        "localinfer.store", "localinfer.store.hub", "localinfer.selection", "localinfer.runtime",
        "localinfer.runtime.engine", "localinfer.runtime.loader", "localinfer.runtime.llama",
        "localinfer.config", "localinfer.paths", "localinfer.errors"]
FRONT_END_LIBS = {"textual", "fastapi", "starlette", "uvicorn"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_runtime_imports_llama_cpp():
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if "llama_cpp" in imported_modules(p)]
    assert offenders == ["runtime/llama.py"]


def test_core_source_imports_no_front_end_library():
    core_files = [p for p in PACKAGE.rglob("*.py")
                  if p.relative_to(PACKAGE).parts[0] in
                  {"hardware", "runtime", "gguf.py", "catalog.py", "planner.py", "store",
                   "selection.py", "config.py", "paths.py", "errors.py"}]
    assert core_files
    for path in core_files:
        assert not imported_modules(path) & FRONT_END_LIBS, path


def test_the_store_neither_probes_nor_reads_the_settings_nor_plans():
    """Choosing is selection.py's, above the store: the store imports none of what it takes."""
    above = {"hardware", "config", "planner", "selection"}
    for path in (PACKAGE / "store").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                names = [node.module] if node.module else [a.name for a in node.names]
                assert not {n.split(".")[0] for n in names} & above, (path.name, names)


def test_core_modules_load_no_front_end_library_at_run_time():
    existing = [m for m in CORE if (PACKAGE.parent / (m.replace(".", "/") + ".py")).exists()
                or (PACKAGE.parent / m.replace(".", "/")).is_dir()]
    code = ("import importlib, json, sys\n"
            f"for m in {existing!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded = {name.split(".")[0] for name in json.loads(out)}
    assert not loaded & FRONT_END_LIBS


@pytest.mark.parametrize("module", ["localinfer.cli", "localinfer.store", "localinfer.catalog",
                                    "localinfer.runtime.loader"])
def test_front_ends_and_core_do_not_load_llama_cpp_until_a_model_loads(module):
    code = f"import sys, {module}; print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
