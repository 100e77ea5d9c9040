"""What a rank imports: megatron-core without Weights & Biases (its inference engine would import
it on every rank), and the real W&B library still there for the tracker afterwards; without
TorchDynamo (megatron-core's ``@jit_fuser`` decorations would import it), and its fused
functions still compiled by ``torch.compile``, at their first call."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import sys
from hpctrain.runtime.versions import import_megatron_core
import_megatron_core()
import megatron.core.inference.contexts.dynamic_context as inference
from megatron.core.fusions import fused_bias_gelu
import torch
print("dynamo imported by megatron-core:", "torch._dynamo" in sys.modules)
print("torch.compile restored:", torch.compile.__module__ == "torch")
print("fusion compiled on first call:", fused_bias_gelu.bias_gelu.compiled_on_first_call)
print("wandb imported by megatron-core:", "wandb" in sys.modules)
print("megatron-core sees wandb:", inference.HAVE_WANDB)
import wandb
print("wandb afterwards:", hasattr(wandb, "init"))
"""


def test_megatron_core_is_imported_without_wandb_or_dynamo_and_wandb_still_imports_afterwards():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["dynamo imported by megatron-core: False",
                                        "torch.compile restored: True",
                                        "fusion compiled on first call: True",
                                        "wandb imported by megatron-core: False",
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


def test_a_deferred_compile_is_torch_compile_with_the_same_options_at_the_first_call():
    import torch

    from hpctrain.runtime.versions import deferred_compile
    graphs = []

    def recording_backend(gm, example_inputs):          # a real TorchDynamo backend
        graphs.append(gm)
        return gm.forward

    @deferred_compile(backend=recording_backend)
    def scaled_gelu(x):
        return torch.nn.functional.gelu(x) * 2

    assert scaled_gelu.__name__ == "scaled_gelu" and graphs == []   # nothing compiled yet
    x = torch.randn(8)
    assert torch.equal(scaled_gelu(x), torch.nn.functional.gelu(x) * 2)
    assert len(graphs) == 1                                           # traced at the first call
    assert torch.equal(scaled_gelu(x + 1), torch.nn.functional.gelu(x + 1) * 2)
    assert len(graphs) == 1                                           # and reused after it
    plain = deferred_compile(lambda y: y + 1, backend=recording_backend)
    assert torch.equal(plain(x), x + 1) and len(graphs) == 2          # the undecorated form
    module = deferred_compile(torch.nn.Linear(8, 2), backend=recording_backend)
    assert isinstance(module, torch.nn.Module) and not hasattr(module, "compiled_on_first_call")


EXIT_PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))  # runs last
from hpctrain.runtime.entry import exit_without_collecting
exit_without_collecting()
print("frozen before exit:", gc.get_freeze_count() > 0)
"""


def test_a_rank_freezes_the_garbage_collector_only_when_its_interpreter_exits():
    """The interpreter's final collections are skipped (see ``exit_without_collecting``):
    frozen at exit, not while the rank trains."""
    proc = subprocess.run([sys.executable, "-c", EXIT_PROBE], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["frozen before exit: False", "frozen at exit: True"]
