"""One backend seam: outside ``hpctrain.scheduler``, no module asks which backend a run or a
profile has (a comparison of a ``scheduler`` value with ``"slurm"`` or ``"local"``), and none
reaches into a backend's own modules: everything goes through
``hpctrain.scheduler.choose`` and the :class:`~hpctrain.scheduler.backend.Backend` interface,
with no exception (a local profile's one node is the local backend's rule too).
"""

from __future__ import annotations

import ast

from tests.structure.test_import_graph import PACKAGE, imports_of, module_files

NAMES = {"slurm", "local"}


def _backend_branches(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(isinstance(s, ast.Constant) and s.value in NAMES for s in sides)
        asks = any("scheduler" in ast.unparse(s) for s in sides
                   if not isinstance(s, ast.Constant))
        if named and asks:
            lines.append(node.lineno)
    return lines


def test_the_branch_finder_sees_a_comparison_with_a_backend_name():
    tree = ast.parse('if profile.scheduler == "local":\n    pass\n'
                     'x = meta.get("scheduler") != "slurm"\n'
                     'y = job.model.transformer_impl == "local"\n')
    assert _backend_branches(tree) == [1, 3]


def test_only_the_backend_choice_asks_which_backend_it_is():
    wrong = []
    for name, path in module_files(PACKAGE).items():
        if name.startswith("hpctrain.scheduler"):
            continue
        wrong += [f"{name}:{line}" for line in _backend_branches(ast.parse(path.read_text()))]
    assert wrong == []


def test_above_the_backends_only_the_interface_and_the_choice_are_imported():
    """Everything above the backends layer imports ``scheduler.backend``, ``scheduler.choose``
    and ``scheduler.state``; ``scheduler.slurm``/``scheduler.local`` are the backends' own,
    except what the submission needs to write a batch script (the Python to run and the
    template's rendering)."""
    allowed = {"hpctrain.scheduler.backend", "hpctrain.scheduler.choose",
               "hpctrain.scheduler.state", "hpctrain.scheduler.interpreters",
               "hpctrain.scheduler.slurm.render"}
    modules = module_files(PACKAGE)
    used = set()
    for name, path in modules.items():
        if name.startswith("hpctrain.scheduler"):
            continue
        for target, _, line in imports_of(name, path, modules):
            if target.startswith("hpctrain.scheduler.") and target not in allowed:
                used.add(f"{name}:{line} {target}")
    assert used == set()
