"""The package's shape: hpctrain's modules import each other without a cycle, the command line
sits on top of the library (a command module imports no other command module), and no import
of hpctrain's own modules is guarded by ``except ImportError`` (a broken module must fail
loudly, not silently skip a check). The order of the layers is ``test_layers``'s.

The graph is read from the source (``ast``), every import counted wherever it is written: in a
function (it runs when the function does) and under ``if TYPE_CHECKING:`` alike (an import a
type checker follows is a dependency all the same, and the layers leave no cycle to hide).
Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, so those edges count too
(but not a module's own packages: they are already running when it runs).
The root package is the public facade: it imports the API lazily, and the library imports
nothing from it but ``__version__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "hpctrain"


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package``."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """``(module imported, name imported from it or "", line)`` for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    root = name.split(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == root]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != root:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, "", node.lineno) if sub in modules
                             else (target, alias.name, node.lineno))
    return found


def import_graph(package: Path) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> modules it makes Python run, and what the library imports from the root
    package (``module:line name``). The root package itself is left out of the graph."""
    modules = module_files(package)
    root = package.name
    graph: dict[str, set[str]] = {m: set() for m in modules if m != root}
    from_root = []
    for name, path in modules.items():
        if name == root:
            continue
        for target, attr, line in imports_of(name, path, modules):
            if target == root:
                from_root.append(f"{name}:{line} {attr or '(the package)'}")
                continue
            parts = target.split(".")
            for i in range(2, len(parts) + 1):     # a.b.c runs a.b's __init__, then a.b.c,
                dep = ".".join(parts[:i])          # except the packages holding this module
                if dep in modules and dep != name and not name.startswith(dep + "."):
                    graph[name].add(dep)
    return graph, from_root


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}      # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None
    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_function_level_cycle_and_one_under_type_checking(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from .a import x\n")
    graph, _ = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.c"] == {"pkg.a"}                # under TYPE_CHECKING: counted
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("")
    assert find_cycle(import_graph(pkg)[0]) is None
    (pkg / "c.py").write_text("def h():\n    import pkg.a\n")
    assert find_cycle(import_graph(pkg)[0]) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]


def test_hpctrain_modules_import_each_other_without_a_cycle():
    graph, _ = import_graph(PACKAGE)
    assert len(graph) > 100, "the graph should hold every module of hpctrain"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_library_imports_only_the_version_from_the_package_facade():
    _, from_root = import_graph(PACKAGE)
    assert from_root, "modules import __version__ from the package"
    assert [f for f in from_root if not f.endswith(" __version__")] == []
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    eager = [n.lineno for n in tree.body
             if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("hpctrain"))
             or isinstance(n, ast.Import) and any(a.name.startswith("hpctrain") for a in n.names)]
    assert eager == [], "hpctrain/__init__.py must import hpctrain's modules lazily"


def test_no_module_of_hpctrain_shares_a_name_with_the_python_api():
    """``hpctrain.submit``, ``hpctrain.plan``, ``hpctrain.runs`` and ``hpctrain.Run`` are the
    API's: no module of the package has one of those names (importing it would rebind the
    package's attribute), so the facade is a plain lazy ``__getattr__``."""
    import hpctrain
    modules = module_files(PACKAGE)
    shadowed = {name for name in hpctrain.__all__ if f"hpctrain.{name}" in modules}
    assert shadowed == set()
    assert len(hpctrain.__all__) == 6 and all(hasattr(hpctrain, n) for n in hpctrain.__all__)
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert classes == [], "the package facade needs no module subclass"


def test_command_modules_import_no_other_command_module_and_the_library_no_cli():
    modules = module_files(PACKAGE)
    wrong = []
    for name, path in modules.items():
        for target, _, line in imports_of(name, path, modules):
            in_cli = target == "hpctrain.cli" or target.startswith("hpctrain.cli.")
            if name.startswith("hpctrain.cli.") and name.endswith("_cmd") and in_cli \
                    and target != "hpctrain.cli.common":
                wrong.append(f"{name}:{line} imports {target}")
            if not name.startswith("hpctrain.cli") and name != "hpctrain.__main__" and in_cli:
                wrong.append(f"{name}:{line} imports {target} (the library is below the CLI)")
    assert wrong == []


def test_no_import_of_hpctrain_is_guarded_by_except_import_error():
    modules = module_files(PACKAGE)
    guarded = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            catches = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if not any("ImportError" in c or "ModuleNotFoundError" in c for c in catches):
                continue
            own = []
            for stmt in node.body:
                for n in ast.walk(stmt):
                    if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith(
                            "hpctrain")):
                        own.append(n.lineno)
                    elif isinstance(n, ast.Import) and any(a.name.startswith("hpctrain")
                                                           for a in n.names):
                        own.append(n.lineno)
                    elif isinstance(n, ast.Call) and ast.unparse(n.func).endswith(
                            "import_module"):
                        own.append(n.lineno)
            guarded += [f"{name}:{line}" for line in own]
    assert guarded == []
