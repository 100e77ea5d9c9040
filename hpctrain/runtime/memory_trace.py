"""Where a training step's memory goes, measured: the other side of ``hpctrain plan``.

``SavedByModule`` records what autograd keeps for backward during one forward pass (one
microbatch), per module, deduplicated by storage, with parameters and DDP's buffers left out:
the measured counterpart of the planner's activation terms (hpctrain.planner.activations).
``FirstStepMemory`` reads the CUDA caching allocator around the first optimizer step: what is
allocated before it, the peak of its forward/backward passes and of ``optimizer.step()``, and
what stays after it (weights, gradient buffer and optimizer state). ``tools/gpu_check`` prints
both beside the plan, so a gap between plan and peak is attributed, not guessed at.
"""

from __future__ import annotations

import re
from collections import defaultdict

LAYER_INDEX = re.compile(r"\.layers\.\d+\.")


def module_kind(name: str) -> str:
    """``module.module.decoder.layers.7.mlp`` -> ``decoder.layers.*.mlp``."""
    while name == "module" or name.startswith("module."):
        name = name[len("module."):]
    return LAYER_INDEX.sub(".layers.*.", name + ".").rstrip(".") or "(model)"


def _storage(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class SavedByModule:
    """A context manager around one microbatch's forward pass of a (DDP-wrapped) model."""

    def __init__(self, model) -> None:
        self.model = model
        self.exclude = {_storage(p)[0] for p in model.parameters()}
        buffers = getattr(model, "buffers", None)   # megatron DDP's list shadows nn.Module's
        for buf in buffers if isinstance(buffers, list) else []:
            for t in (getattr(buf, "grad_data", None), getattr(buf, "param_data", None)):
                if t is not None:
                    self.exclude.add(_storage(t)[0])
        self.saved: dict[int, tuple[int, str, tuple, str]] = {}
        self._stack: list[str] = []
        self._handles: list = []
        self._hooks = None

    def exclude_inputs(self, *tensors) -> None:
        self.exclude |= {_storage(t)[0] for t in tensors}

    def _pack(self, t):
        ptr, nbytes = _storage(t)
        if ptr and ptr not in self.exclude and ptr not in self.saved:
            where = self._stack[-1] if self._stack else ""
            self.saved[ptr] = (nbytes, str(t.dtype).replace("torch.", ""), tuple(t.shape), where)
        # what the graph keeps: the same storage (alive, so no later tensor reuses its
        # address during the pass), but not the tensor itself: a node that saves its own
        # output would otherwise hold it, and through its grad_fn itself, in a cycle through
        # autograd's C++ nodes that nothing collects (the model's memory then never returns)
        return t.detach()

    def _pop(self, *_):
        if self._stack:
            self._stack.pop()

    def __enter__(self) -> "SavedByModule":
        import torch
        for name, mod in self.model.named_modules():
            self._handles.append(mod.register_forward_pre_hook(
                lambda m, a, name=name: self._stack.append(name)))
            self._handles.append(mod.register_forward_hook(self._pop))
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @property
    def total(self) -> int:
        return sum(v[0] for v in self.saved.values())

    def report(self) -> dict:
        """Totals by module kind (layers folded together) and the largest tensors."""
        by_kind: dict[str, int] = defaultdict(int)
        for nbytes, _, _, where in self.saved.values():
            by_kind[module_kind(where)] += nbytes
        largest = sorted(self.saved.values(), key=lambda v: -v[0])[:12]
        return {"bytes": self.total,
                "by_module": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
                "largest": [{"bytes": n, "dtype": d, "shape": list(s), "module": w}
                            for n, d, s, w in largest]}


class FirstStepMemory:
    """The CUDA allocator's figures around the first step (nothing on the CPU)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.figures: dict[str, int] = {}
        self.peak = 0

    def _read(self, allocated: str, peak: str | None = None) -> None:
        if not self.cuda:
            return
        import torch
        torch.cuda.synchronize()
        self.figures[allocated] = torch.cuda.memory_allocated()
        if peak:
            self.figures[peak] = torch.cuda.max_memory_allocated()
            self.peak = max(self.peak, self.figures[peak])
        torch.cuda.reset_peak_memory_stats()

    def before_step(self) -> None:
        self._read("before_first_step")

    def after_forward_backward(self) -> None:
        self._read("after_forward_backward", "forward_backward_peak")

    def after_optimizer_step(self) -> None:
        self._read("after_first_step", "optimizer_step_peak")

    def overall_peak(self) -> int | None:
        """The peak of the whole run (the resets above hide earlier peaks from torch)."""
        if not self.cuda:
            return None
        import torch
        return max(self.peak, torch.cuda.max_memory_allocated())
