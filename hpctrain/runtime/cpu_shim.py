"""Run megatron-core's CUDA-only code paths on a CPU build of torch, for rehearsal and tests.

megatron-core hard-codes ``device="cuda"``, ``torch.cuda.current_device()`` and CUDA RNG calls
in places the CPU path never avoids. Rather than patch megatron (and drift with it), this
module makes CUDA requests land on the CPU:

* a ``TorchFunctionMode`` rewrites ``device="cuda" | "cuda:N" | N`` in factory calls to CPU,
  makes ``tensor.cuda()`` a no-op (the distributed optimizer's fully reshardable checkpoint
  gathers through it) and makes ``Tensor.type()`` report ``torch.cuda.*`` names (the
  distributed optimizer and grad clipping check for them);
* small stand-ins for ``torch.cuda.current_device/synchronize/manual_seed/get_rng_state``,
  ``default_generators`` and ``_lazy_call`` (the RNG tracker) use the CPU generator;
* the tensor factories (``torch.ones`` ...) and ``Tensor.cuda`` are also redirected globally,
  because function modes are thread-local and inactive inside autograd's backward, where
  activation recomputation runs megatron's forward again;
* every gloo process group shares one gloo device (:mod:`hpctrain.runtime.gloo_groups`): one
  event loop per rank instead of one per group, each waking every 10 ms.

megatron-core binds ``torch.cuda._lazy_call`` by name at import (``tensor_parallel.random``,
megatron-FSDP's utils), so ``install()`` also rebinds it in every module already imported: the
shim works whether megatron-core was imported before it or after. Torch's own ``_lazy_call``,
before CUDA starts, only queues the call with a formatted stack trace: every RNG-tracker fork
(each attention dropout, each microbatch) then set no RNG state, cost a stack walk (a tenth of
a CPU step of a 16-layer model) and grew ``torch.cuda._queued_calls`` for the life of the rank.
It changes nothing on a machine that trains on GPUs: the runtime installs it only when the
device is CPU. Validated on megatron-core 0.16.1.
"""

from __future__ import annotations

import functools
import logging
import sys

import torch
from torch.overrides import TorchFunctionMode


def _as_cpu(device):
    """'cuda', 'cuda:N', torch.device('cuda'), and bare ints (CUDA ordinals) -> CPU."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, (str, torch.device)) and str(device).startswith("cuda"):
        return torch.device("cpu")
    return device


class CudaToCpuMode(TorchFunctionMode):
    """Redirects CUDA device arguments to the CPU for every torch function call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _as_cpu(kwargs["device"])}
        if func is torch.Tensor.cuda:
            # tensor.cuda(): the CPU tensor is already where "cuda" lives
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


# Factories megatron calls with device="cuda" where the mode is not active: torch function
# modes are thread-local and off inside autograd's backward, where activation recomputation
# re-runs the forward (e.g. the causal mask built in the attention).
FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "as_tensor", "arange", "rand", "randn",
             "randint", "randperm", "eye", "linspace", "empty_strided", "empty_like", "zeros_like",
             "ones_like", "full_like", "rand_like", "randn_like")


def _cpu_factory(factory):
    @functools.wraps(factory)
    def call(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _as_cpu(kwargs["device"])
        return factory(*args, **kwargs)
    return call


def _patch_globally() -> None:
    for name in FACTORIES:
        setattr(torch, name, _cpu_factory(getattr(torch, name)))
    torch.Tensor.cuda = lambda self, *a, **k: self


_mode: CudaToCpuMode | None = None


def _run_now(callback, **_):
    """``torch.cuda._lazy_call`` on the CPU: there is no CUDA start to wait for."""
    callback()


def _rebind_lazy_call(original, replacement) -> None:
    """``torch.cuda._lazy_call`` and every imported module's own binding of it (a module
    that did ``from torch.cuda import _lazy_call`` keeps torch's function otherwise)."""
    torch.cuda._lazy_call = replacement
    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", {}).get("_lazy_call") is original:
            module._lazy_call = replacement


def install() -> None:
    """Install the shim in this process (idempotent)."""
    global _mode
    if _mode is not None:
        return
    cuda = torch.cuda
    cuda.current_device = lambda: 0
    cuda.synchronize = lambda *a, **k: None
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    cuda.get_rng_state = cuda.random.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.set_rng_state = cuda.random.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    cuda.default_generators = (torch.default_generator,)
    _rebind_lazy_call(cuda._lazy_call, _run_now)
    _patch_globally()
    # The CUDA generator *is* the CPU generator here, so megatron's check that drawing from
    # its CUDA RNG tracker leaves the CPU generator untouched cannot hold; only its warning
    # (one line per initialized weight) is silenced.
    logging.getLogger("megatron.core.tensor_parallel.random").setLevel(logging.ERROR)
    _mode = CudaToCpuMode()
    _mode.__enter__()
    from .gloo_groups import share_one_device
    share_one_device()   # every process group here is gloo: one event loop, not one per group
