"""Every read of a run-folder file goes through ``hpctrain.record.reader``: no other module of
the packages that read run folders reads a file directly (``Path.read_text``/``read_bytes``,
``json.load``, a plain ``open`` for reading). Writers, and the few reads of files that are not
a run folder's, are listed here with the reason."""

from __future__ import annotations

import ast

from tests.structure.test_import_graph import PACKAGE

# packages whose modules read run or checkpoint folders
GUARDED = ("record", "health", "view", "ops", "cli", "api.py", "scheduler", "runtime",
           "submission", "preflight")
ALLOWED = {
    "record/reader.py": "the door itself",
    "scheduler/local/jobs.py": "reads /proc/PID/cmdline, not a run folder",
    "preflight/infiniband.py": "reads sysfs, not a run folder",
    "preflight/storage.py": "reads /proc/mounts and its own probe file",
    "runtime/step_profile.py": "reads the trace torch wrote into its own temporary folder",
}


def _reads(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("read_text", "read_bytes") and not (
                isinstance(f.value, ast.Name) and f.value.id == "reader"):
            lines.append(node.lineno)
        elif isinstance(f, ast.Attribute) and f.attr == "load" and \
                isinstance(f.value, ast.Name) and f.value.id == "json":
            lines.append(node.lineno)
        elif isinstance(f, ast.Name) and f.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            text = mode.value if isinstance(mode, ast.Constant) else "r"
            if not any(c in str(text) for c in "wax"):
                lines.append(node.lineno)
    return lines


def test_no_module_reads_a_run_file_past_the_reader():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(GUARDED) or rel in ALLOWED:
            continue
        for line in _reads(ast.parse(path.read_text())):
            found.append(f"hpctrain/{rel}:{line}")
    assert not found, ("read a run-folder file through hpctrain.record.reader (or list the "
                       "module in ALLOWED with the reason): " + ", ".join(found))


def test_the_check_sees_a_direct_read():
    tree = ast.parse("import json\nfrom pathlib import Path\n"
                     "a = Path('x').read_text()\nb = json.load(open('y'))\n"
                     "c = open('z', 'a')\n")
    assert _reads(tree) == [3, 4, 4]


def test_sweep_folders_are_named_and_read_in_one_module_only():
    """``sweep.yaml`` is named only by ``record/sweeps.py`` (``SWEEP_FILE``), the one door of
    sweep folders: every other module reads a sweep through it (``read_sweep``,
    ``sweep_runs``, ``sweep_folder_of``), so no reader of a sweep folder skips its checks."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "record/sweeps.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "sweep.yaml":
                found.append(f"hpctrain/{rel}:{node.lineno}")
    assert not found, "name a sweep folder's files through hpctrain.record.sweeps: " + \
        ", ".join(found)
