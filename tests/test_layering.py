"""The architecture's rules: the core imports no UI or web framework, and only runtime/
imports llama_cpp (checked in the source, and in a fresh interpreter)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import import_graph

PACKAGE = Path(__file__).resolve().parent.parent / "localinfer"
CORE = ["localinfer.hardware", "localinfer.gguf", "localinfer.catalog", "localinfer.planner",
        "localinfer.store", "localinfer.store.hub", "localinfer.selection", "localinfer.runtime",
        "localinfer.runtime.engine", "localinfer.loading", "localinfer.runtime.llama",
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
    offenders = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                       if "llama_cpp" in imported_modules(p))
    assert offenders == [f"runtime/llama/{name}.py" for name in (
        "__init__", "decode", "ggml_devices", "model", "native", "quantize", "sampling",
        "seq_state", "vocab")]


def test_core_source_imports_no_front_end_library():
    core_files = [p for p in PACKAGE.rglob("*.py")
                  if p.relative_to(PACKAGE).parts[0] in
                  {"hardware", "runtime", "loading.py", "gguf.py", "catalog.py", "planner", "store",
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
                                    "localinfer.loading"])
def test_front_ends_and_core_do_not_load_llama_cpp_until_a_model_loads(module):
    code = f"import sys, {module}; print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


@pytest.mark.parametrize("module", ["localinfer.client", "localinfer.cli", "localinfer.session",
                                    "localinfer.protocol"])
def test_client_cli_and_session_load_no_engine_jinja2_numpy_or_llama_cpp(module):
    heavy = ["localinfer.runtime.engine", "jinja2", "numpy", "llama_cpp"]
    code = (f"import json, sys, {module}\n"
            f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def deferred_imports(path: Path) -> set[str]:
    """Modules imported inside a function of ``path`` (``if TYPE_CHECKING:`` blocks aside)."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if (isinstance(child, ast.If) and isinstance(child.test, ast.Name)
                    and child.test.id == "TYPE_CHECKING"):
                continue
            if in_function and isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                base = package[:len(package) - child.level + 1] if child.level else []
                if child.module:
                    found.add(".".join([*base, child.module]))
                else:  # from .. import gguf: the modules named
                    found.update(".".join([*base, alias.name]) for alias in child.names)
            visit(child, in_function or isinstance(child, (ast.FunctionDef,
                                                           ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


EDGE = re.compile(r"[a-z_][\w.]* -> [a-z_][\w.]*")
"""A key of [tool.localinfer.deferred-imports]: ``importer.module -> imported.module``."""


def test_every_deferred_import_is_listed_with_its_reason():
    """Each import inside a function is one listed edge, ``"importer -> imported"``, with why
    that import waits (what it would cost or break at the top of its file); no listed edge is
    stale. All four kinds of problem are reported together."""
    listed = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["localinfer"]["deferred-imports"]
    found = {f"{_module_name(path)} -> {name}"
             for path in PACKAGE.rglob("*.py") for name in deferred_imports(path)}
    problems = {
        "unlisted (import it at the top, or list the edge with its reason)":
            sorted(found - set(listed)),
        "stale (listed, but no longer imported inside a function)":
            sorted(set(listed) - found - {k for k in listed if not EDGE.fullmatch(k)}),
        'not one edge (a key is "importer.module -> imported.module")':
            sorted(key for key in listed if not EDGE.fullmatch(key)),
        "no reason (under 20 characters: say what it would cost or break at the top)":
            sorted(key for key, why in listed.items() if not isinstance(why, str) or len(why) < 20),
    }
    problems = {kind: keys for kind, keys in problems.items() if keys}
    assert problems == {}, "[tool.localinfer.deferred-imports] in pyproject.toml:\n" + "\n".join(
        f"  {kind}:\n" + "\n".join(f"    {key}" for key in keys) for kind, keys in problems.items())


@pytest.mark.parametrize("packages", [False, True], ids=["modules", "packages"])
def test_no_import_circle_of_any_kind(packages):
    """Not at the top of a module, not inside a function, not under ``if TYPE_CHECKING:``:
    mutual knowledge a reader must untangle, even where it does not fail at run time."""
    assert import_graph.circles(packages=packages) == []
