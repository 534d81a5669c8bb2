#!/usr/bin/env python3
"""Fails if any module of the house uses another in a circle: the modules of each crate under
`crates/` (a file of `src/`, or a folder of them), and the modules of the Python package; or if the
library (`vrampool.*`) uses the what-if application built on it (`vrampool.whatif`), an arrow back up.

A Rust module uses another when it writes a path `crate::name` (`$crate::name`, `crate::{name, ...}`);
a path to an item the crate root re-exports (`pub use module::Item`) is a use of that module, one to
an item of the root itself a use of the root. The root's `mod` lines are not uses, so an `impl`
spread over files does not count as a circle; paths within a folder (`super::`) stay inside its
module. A Python module uses another when it imports it (or a name from it) anywhere, in a function
or under `TYPE_CHECKING` too; `from package import module` is a use of that module, and a name
imported from a package a use of the package's `__init__`.

    python3 scripts/check-imports.py            # prints each circle and arrow up, exits 1 if there is one
    python3 scripts/check-imports.py --graph    # prints every module's uses
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Dict, List, Set

Graph = Dict[str, Set[str]]

#: The Python package's layers, lowest first: a module may use its own layer's and those below.
LAYERS = ("vrampool", "vrampool.whatif")

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"(?<![\w:])\$?crate::(\{[^}]*\}|\w+)")
REEXPORT = re.compile(r"pub(?:\([^)]*\))? use (?:crate::|self::)?(\w+)::(\{[^}]*\}|[\w:]+)")


def rust_graph(src: Path) -> Graph:
    files: Dict[str, List[Path]] = {}
    for path in sorted(src.rglob("*.rs")):
        top = path.relative_to(src).parts[0].removesuffix(".rs")
        files.setdefault("lib" if top in ("lib", "main") else top, []).append(path)
    reexported: Dict[str, str] = {}
    for root in (src / "lib.rs", src / "main.rs"):
        if root.exists():
            for module, items in REEXPORT.findall(root.read_text()):
                names = items[1:-1].split(",") if items.startswith("{") else [items]
                for name in names:
                    reexported[name.strip().split("::")[-1].split(" as ")[-1]] = module
    graph: Graph = {module: set() for module in files}
    for module, paths in files.items():
        for path in paths:
            code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("//"))
            for group in PATH.findall(code):
                names = group[1:-1].split(",") if group.startswith("{") else [group]
                for name in (n.strip().split("::")[0] for n in names):
                    used = name if name in files else reexported.get(name, "lib")
                    if name and used != module:
                        graph[module].add(used)
    return graph


def python_graph(package: Path) -> Graph:
    modules = {}
    for path in sorted(package.rglob("*.py")):
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{parent}.{base}" if base else parent
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def layer(module: str) -> int:
    """The index in `LAYERS` of the longest prefix naming `module`'s layer."""
    return max(i for i, prefix in enumerate(LAYERS) if module == prefix or module.startswith(prefix + "."))


def arrows_up(graph: Graph) -> List[str]:
    """Each use of a module of a higher layer, as `module -> used`."""
    return [f"{m} -> {u}" for m in sorted(graph) for u in sorted(graph[m]) if layer(u) > layer(m)]


def circles(graph: Graph) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    graphs = {f"crates/{src.parent.name}": rust_graph(src) for src in sorted(ROOT.glob("crates/*/src"))}
    graphs["python/vrampool"] = python_graph(ROOT / "python" / "vrampool")
    failed = False
    for arrow in arrows_up(graphs["python/vrampool"]):
        failed = True
        print(f"python/vrampool: the library uses the what-if ({arrow})")
    for where, graph in graphs.items():
        if "--graph" in sys.argv:
            for module in sorted(graph):
                print(f"{where}: {module} -> {', '.join(sorted(graph[module])) or '-'}")
        for component in circles(graph):
            failed = True
            edges = "; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(component)))}" for m in component)
            print(f"{where}: a circle among {', '.join(component)} ({edges})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
