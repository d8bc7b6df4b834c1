#!/usr/bin/env python3
"""Import circles in localinfer/, of any kind: every import statement counts, at the top of a
module, inside a function, or under ``if TYPE_CHECKING:`` (read with ``ast``, nothing is
imported). Prints each circle's modules and the edges that close it, and exits 1 if any.

    python tests/import_graph.py             # between modules (files)
    python tests/import_graph.py --packages  # between localinfer's top-level packages/modules

tests/test_layering.py asserts that both find none.

``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``; the
package ``__init__`` a submodule's import runs first is not counted as an edge.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "localinfer"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kind_of(stack: list[ast.AST]) -> str:
    for node in reversed(stack):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return "type-checking"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return "function"
    return "top"


def edges_of(path: Path, modules: set[str]) -> list[tuple[str, str, str, int]]:
    """(importer, imported, kind, line) for each import of a localinfer module in ``path``."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[tuple[str, str, str, int]] = []

    def target(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST, stack: list[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = package[:len(package) - child.level + 1] if child.level else []
                stem = ".".join([*base, *([child.module] if child.module else [])])
                names = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem
                         for alias in child.names]
            for imported in names:
                hit = target(imported)
                if hit is not None and hit.startswith("localinfer") and hit != name:
                    found.append((name, hit, kind_of([*stack, child]), child.lineno))
            visit(child, [*stack, child])

    visit(ast.parse(path.read_text(encoding="utf-8")), [])
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def circles(*, packages: bool = False) -> list[tuple[list[str], list[str]]]:
    """Each circle's nodes and the imports that close it (``importer:line -> imported
    (kind)``), between modules or, with ``packages``, between top-level packages/modules."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in files}
    edges = [e for p in files for e in edges_of(p, modules)]

    def node(module: str) -> str:
        return ".".join(module.split(".")[:2]) if packages else module

    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], set[str]] = defaultdict(set)
    for importer, imported, kind, line in edges:
        a, b = node(importer), node(imported)
        if a != b:
            graph[a].add(b)
            where[a, b].add(f"{importer}:{line} -> {imported} ({kind})")
    found = []
    for component in strongly_connected(graph):
        members = set(component)
        found.append((component, [detail for a in component for b in sorted(graph[a] & members)
                                  for detail in sorted(where[a, b])]))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", action="store_true",
                        help="between localinfer's top-level packages and modules")
    args = parser.parse_args()
    found = circles(packages=args.packages)
    for component, details in found:
        print("circle: " + ", ".join(component))
        for detail in details:
            print(f"    {detail}")
    print(f"{len(found)} circle(s) {'between packages' if args.packages else 'between modules'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
