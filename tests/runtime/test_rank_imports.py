"""What a rank imports: megatron-core without Weights & Biases (its inference engine would import
it on every rank), and the real W&B library still there for the tracker afterwards."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import sys
from hpctrain.runtime.versions import import_megatron_core
import_megatron_core()
import megatron.core.inference.contexts.dynamic_context as inference
print("wandb imported by megatron-core:", "wandb" in sys.modules)
print("megatron-core sees wandb:", inference.HAVE_WANDB)
import wandb
print("wandb afterwards:", hasattr(wandb, "init"))
"""


def test_megatron_core_is_imported_without_wandb_and_wandb_still_imports_afterwards():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["wandb imported by megatron-core: False",
                                        "megatron-core sees wandb: False",
                                        "wandb afterwards: True"], proc.stdout


def test_the_rank_calls_the_door_before_importing_any_runtime_module():
    """``_train`` imports megatron-core through the door before any runtime module (each of
    which may import megatron-core) is imported."""
    import ast
    import inspect

    from hpctrain.runtime import entry
    body = ast.parse(inspect.getsource(entry._train)).body[0].body
    door = next(i for i, n in enumerate(body) if isinstance(n, ast.Expr)
                and isinstance(n.value, ast.Call)
                and getattr(n.value.func, "id", "") == "import_megatron_core")
    before = [n for n in body[:door] if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [(n.module, [a.name for a in n.names]) for n in before] == \
        [("versions", ["import_megatron_core"])]
