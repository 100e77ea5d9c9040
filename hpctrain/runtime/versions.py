"""The megatron-core version hpctrain was validated against, and the check that enforces it.

hpctrain depends on megatron-core internals (distributed-optimizer checkpoint metadata, the
schedules' in-place loss division, the CPU shim's coverage). A different version may train
silently wrong, so the runtime refuses it with a message naming the pinned version.
"""

from __future__ import annotations

from importlib import metadata

from ..errors import HpcTrainError

MEGATRON_CORE_VERSION = "0.16.1"


class UnsupportedVersionError(HpcTrainError):
    pass


def installed_megatron_core() -> str | None:
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def check_megatron_core(found: str | None = None) -> str:
    """Return the installed version or raise with the fix. Reads package metadata only (no import)."""
    found = installed_megatron_core() if found is None else found
    if found is None:
        raise UnsupportedVersionError(
            f"megatron-core is not installed; install the validated version: "
            f"pip install megatron-core=={MEGATRON_CORE_VERSION}")
    if found != MEGATRON_CORE_VERSION:
        raise UnsupportedVersionError(
            f"megatron-core {found} is installed but hpctrain is validated against "
            f"{MEGATRON_CORE_VERSION} only (it relies on its internals); "
            f"pip install megatron-core=={MEGATRON_CORE_VERSION}")
    return found


_TORCH_COMPILE = None     # the real torch.compile, kept while megatron-core imports


def import_megatron_core() -> None:
    """Import megatron-core once, before any runtime module does, without Weights & Biases and
    without torch's compiler stack.

    * ``megatron.core``'s package import pulls in its inference engine, which imports ``wandb``
      whenever it is installed (to log inference metrics a training run never produces): about
      0.7 s of CPU and several hundred files per rank, paid by every rank of every attempt on a
      machine where the W&B tracker is installed. It is hidden while megatron-core imports (its
      inference code then sees W&B as absent), and visible again afterwards, so the W&B tracker
      (rank 0, when the job asks for it) imports the real library. When W&B is already
      imported nothing is hidden.
    * megatron-core decorates its fusions with ``jit_fuser``, which is ``torch.compile``, at
      import time; that decoration alone imports TorchDynamo and Inductor (with networkx and
      functorch's partitioners): about 2.5 CPU-s of a rank's 7 s of imports, paid even when no
      fused function is ever called (the CPU rehearsal, a run with the fusions off).
      ``torch.compile`` compiles on a function's first call anyway, so while megatron-core
      imports it is replaced by :func:`deferred_compile`, which makes the same
      ``torch.compile`` call at that first call: the same compiled function, only its import
      moved to where it is used."""
    import sys
    if "megatron.core" in sys.modules:
        return
    import torch
    global _TORCH_COMPILE
    _TORCH_COMPILE = _TORCH_COMPILE or torch.compile
    hide = "wandb" not in sys.modules
    if hide:
        sys.modules["wandb"] = None      # `import wandb` raises ImportError meanwhile
    torch.compile = deferred_compile
    try:
        import megatron.core  # noqa: F401
    finally:
        torch.compile = _TORCH_COMPILE
        if hide and sys.modules.get("wandb", 0) is None:
            del sys.modules["wandb"]


def deferred_compile(model=None, **options):
    """``torch.compile(model, **options)``, made when the function is first called.

    Used as ``torch.compile`` while megatron-core imports (see :func:`import_megatron_core`):
    a decorator (``@torch.compile`` and ``@torch.compile(**options)``) on a function returns a
    wrapper that calls the real ``torch.compile`` with the same arguments at its first call and
    the compiled function from then on. Anything but a plain function (an ``nn.Module``) is
    compiled at once, as ``torch.compile`` does."""
    import functools
    import inspect

    import torch
    real_compile = _TORCH_COMPILE or torch.compile
    if model is None:
        return lambda fn: deferred_compile(fn, **options)
    if not inspect.isfunction(model):
        return real_compile(model, **options)
    compiled = None

    @functools.wraps(model)
    def first_call_compiles(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = real_compile(model, **options)
        return compiled(*args, **kwargs)

    first_call_compiles.compiled_on_first_call = True
    return first_call_compiles
