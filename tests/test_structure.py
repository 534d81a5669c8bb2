"""The import check (`scripts/check-imports.py`) finds circles, and the house has none."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check-imports.py"


def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_circle_of_rust_modules_is_found_through_re_exports_and_groups(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pool").mkdir(parents=True)
    (src / "lib.rs").write_text("mod arena;\nmod pool;\nmod stats;\npub use stats::Figures;\n")
    (src / "arena.rs").write_text("// crate::pool in a comment is no use\nuse crate::Figures;\n")
    (src / "stats.rs").write_text("use crate::{arena::Arena, config};\n")
    (src / "pool" / "mod.rs").write_text("use super::general;\n")
    (src / "pool" / "general.rs").write_text("use crate::stats::Figures;\n")
    graph = check().rust_graph(src)
    assert graph["arena"] == {"stats"} and graph["stats"] == {"arena", "lib"} and graph["pool"] == {"stats"}
    assert check().circles(graph) == [["arena", "stats"]]


def test_a_circle_of_python_modules_is_found_in_functions_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import A\n")
    (package / "a.py").write_text("A = 1\n\ndef f():\n    from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from pkg import a\n")
    (package / "c.py").write_text("from pkg import A\n")
    graph = check().python_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg"}
    assert check().circles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_a_library_module_using_the_what_if_is_an_arrow_up() -> None:
    graph = {"vrampool.pool": {"vrampool.whatif.replay"}, "vrampool.whatif.replay": {"vrampool.pool"}, "vrampool": set()}
    assert check().arrows_up(graph) == ["vrampool.pool -> vrampool.whatif.replay"]
    assert check().arrows_up({"vrampool.whatif.cli": {"vrampool.pool", "vrampool"}}) == []


def test_the_house_has_no_circle_and_no_arrow_up() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout
