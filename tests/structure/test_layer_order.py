"""The layers of hpctrain, and the rule that holds them: a module imports only from its own
layer or below, every import counted (at the top of a file, inside a function, under
``if TYPE_CHECKING:``), and the packages import each other without a cycle.

``LAYERS`` is the declaration ``docs/architecture.md`` explains, from the ground up. A module
belongs to the layer of its top-level package or module (``hpctrain.record.folder`` to
``record``'s). A new top-level package or module must be given a layer here before its first
import is accepted.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from pathlib import Path

import pytest

from tests.structure.test_import_graph import PACKAGE, find_cycle, import_graph, module_files

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # values and rules: no I/O beyond reading the files they are given (and the environment)
    ("values", ("errors", "exit_codes", "resources", "config", "model_shape", "flops",
                "gpu_table", "checkpoint_interval", "fault_injection", "identity", "limits",
                "outputs", "file_door", "caller_data")),
    # the run record: what a run folder holds, and the rules that read it (torch-free)
    ("record", ("record", "health")),
    # where jobs run: one backend interface, Slurm and local behind it
    ("backends", ("scheduler",)),
    # what the use cases are built from: data, the planner, a run seen from outside, preflight
    # and the training runtime (torch is imported here and nowhere below)
    ("services", ("data", "planner", "view", "preflight", "runtime", "tracking")),
    # what a person does: submit, operate on runs, benchmark
    ("use cases", ("submission", "ops", "bench")),
    # the faces: the Python API and the command line, thin over the use cases
    ("faces", ("api", "cli", "cli_start", "__main__")),
]


@functools.lru_cache(maxsize=1)
def hpctrain_graph() -> dict[str, set[str]]:
    """hpctrain's import graph, read once for the tests of this file."""
    return import_graph(PACKAGE)[0]


def layer_of(module: str, layers=LAYERS) -> int:
    """Index in ``layers`` of a module (``pkg.top.rest``), from its top-level name."""
    top = module.split(".")[1]
    for i, (_, names) in enumerate(layers):
        if top in names:
            return i
    raise KeyError(f"{module}: its top-level name {top!r} is in no layer of LAYERS")


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import of a module from a layer above its own, as ``a (layer) -> b (layer)``."""
    wrong = []
    for module, deps in sorted(graph.items()):
        own = layer_of(module, layers)
        for dep in sorted(deps):
            if layer_of(dep, layers) > own:
                wrong.append(f"{module} ({layers[own][0]}) -> {dep} "
                             f"({layers[layer_of(dep, layers)][0]})")
    return wrong


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Top-level package -> the top-level packages it imports (itself left out)."""
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        top = ".".join(module.split(".")[:2])
        out.setdefault(top, set())
        out[top] |= {".".join(d.split(".")[:2]) for d in deps} - {top}
    return out


def import_statements_in_text(path: Path, root: str) -> set[int]:
    """Lines of the import statements naming ``root``'s modules, found in the token stream
    instead of the syntax tree: a second count, so that no way of writing an import (in a
    function, under a condition, on a continued line) escapes the graph unnoticed."""
    lines = set()
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
              if t.type not in (tokenize.COMMENT, tokenize.NL)]
    starts = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for i, tok in enumerate(tokens[:-1]):
        if tok.type != tokenize.NAME or tok.string not in ("from", "import"):
            continue
        before = tokens[i - 1] if i else None
        at_start = before is None or before.type in starts or before.string in (":", ";")
        nxt = tokens[i + 1]
        if not at_start:
            continue
        if tok.string == "from" and (nxt.string.startswith(".") or nxt.string == root):
            lines.add(tok.start[0])
        elif tok.string == "import" and nxt.string == root:
            lines.add(tok.start[0])
    return lines


def _graph_import_lines(package: Path) -> dict[str, set[int]]:
    """Per module, the lines of the import statements the graph was built from."""
    from tests.structure.test_import_graph import imports_of
    modules = module_files(package)
    return {name: {line for _, _, line in imports_of(name, path, modules)}
            for name, path in modules.items()}


# ---- the checker itself ---------------------------------------------------------------------


def test_the_layer_check_finds_an_upward_import_inside_a_function_and_under_type_checking(
        tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("X = 1\n")
    (pkg / "high.py").write_text("from .low.a import X\n")
    layers = [("low", ("low",)), ("high", ("high",))]
    graph, _ = import_graph(pkg)
    assert upward_imports(graph, layers) == []
    (pkg / "low" / "a.py").write_text("def f():\n    from ..high import g\n")
    assert upward_imports(import_graph(pkg)[0], layers) == ["pkg.low.a (low) -> pkg.high (high)"]
    (pkg / "low" / "a.py").write_text("from typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    import pkg.high\n")
    assert upward_imports(import_graph(pkg)[0], layers) == ["pkg.low.a (low) -> pkg.high (high)"]
    (pkg / "other.py").write_text("")
    with pytest.raises(KeyError, match="'other' is in no layer"):
        upward_imports(import_graph(pkg)[0], layers)


def test_the_text_count_sees_every_way_of_writing_an_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('"""from hpctrain import x (a docstring, not an import)"""\n'
                      "import os\n"
                      "from . import a\n"
                      "if True: from ..b import (c,\n"
                      "                          d)\n"
                      "def f():\n"
                      "    import hpctrain.e; import hpctrain.f  # from hpctrain import g\n")
    assert import_statements_in_text(source, "hpctrain") == {3, 4, 7}


# ---- hpctrain ---------------------------------------------------------------------------------


def test_every_module_of_hpctrain_is_in_a_layer():
    graph = hpctrain_graph()
    missing = []
    for module in graph:
        try:
            layer_of(module)
        except KeyError as e:
            missing.append(str(e))
    assert missing == []
    named = [n for _, names in LAYERS for n in names]
    assert len(named) == len(set(named)), "a name is in two layers"


def test_no_module_imports_from_a_layer_above_its_own():
    graph = hpctrain_graph()
    counted = sum(len(deps) for deps in graph.values())
    assert counted > 500, f"only {counted} imports counted: the graph lost some"
    assert upward_imports(graph) == []


def test_the_graph_counts_every_import_statement_of_hpctrain():
    """The syntax tree and the token stream agree on where hpctrain imports itself, so the
    layer check above saw every import (lazy ones and TYPE_CHECKING ones included)."""
    modules = module_files(PACKAGE)
    from_graph = _graph_import_lines(PACKAGE)
    differ = {}
    lazy = 0
    for name, path in modules.items():
        if name == "hpctrain":
            continue
        in_text = import_statements_in_text(path, "hpctrain")
        if from_graph[name] != in_text:
            differ[name] = sorted(from_graph[name] ^ in_text)
        tree = ast.parse(path.read_text())
        lazy += sum(1 for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                    for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom)) and
                    n.lineno in in_text)
    assert differ == {}
    assert lazy > 100, "imports inside functions are counted too"


def test_the_packages_import_each_other_without_a_cycle():
    graph = hpctrain_graph()
    packages = package_graph(graph)
    cycle = find_cycle(packages)
    assert cycle is None, "package import cycle: " + " -> ".join(cycle)



def test_torch_is_imported_only_from_the_services_layer_up():
    """The run record, the backends and the values below them never import torch or megatron,
    lazily or not: the batch shell, the CLI and the Python API use them without a GPU stack."""
    heavy = {"torch", "megatron", "transformer_engine", "apex"}
    services = next(i for i, (name, _) in enumerate(LAYERS) if name == "services")
    wrong = []
    for name, path in module_files(PACKAGE).items():
        if name == "hpctrain" or layer_of(name) >= services:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                wrong += [f"{name}:{node.lineno} {a.name}" for a in node.names
                          if a.name.split(".")[0] in heavy]
            elif isinstance(node, ast.ImportFrom) and not node.level and \
                    (node.module or "").split(".")[0] in heavy:
                wrong.append(f"{name}:{node.lineno} {node.module}")
    assert wrong == []
