"""optimizer.step()'s own memory: torch's foreach Adam (megatron-core's fallback on CUDA without
Transformer Engine or apex) allocates an fp32 copy of every element it updates; the plan counts
it where it is larger than the activations (which are freed by then), and only for that Adam."""

from __future__ import annotations

import torch
from plan_jobs import LLAMA2_7B, make_job
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from hpctrain.config import Layout
from hpctrain.planner.layouts import Target, plan_layout
from hpctrain.planner.timing import Hardware


class NewBytesPeak(TorchDispatchMode):
    """Peak bytes of the tensors created inside the mode and still alive."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr():
                s = t.untyped_storage()
                self.live.setdefault(s.data_ptr(), (StorageWeakRef(s), s.nbytes()))
        self.live = {p: v for p, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


def test_foreach_adam_allocates_one_fp32_copy_of_the_elements_it_updates():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (4096, 1000, 77)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    opt.step()                       # the moments exist from now on, as in every later step
    with NewBytesPeak() as mode:
        opt.step()
    elements = sum(p.numel() for p in params)
    # sqrt(exp_avg_sq) for every element at once; a few scalars (step counts) beside it
    assert 4 * elements <= mode.peak <= 4 * elements + 4096


def _plan(transformer_impl: str, recompute: str | None, fused_adam: bool = False):
    # the local spec with megatron's unfused attention: its scores make the activations large;
    # torch's foreach AdamW (train.fused_adam: false) allocates the step's copy
    unfused = {"attention_backend": "local"} if transformer_impl == "local" else {}
    train = {"fused_adam": fused_adam, **({"recompute_granularity": recompute} if recompute
                                          else {})}
    job = make_job(dict(LLAMA2_7B, transformer_impl=transformer_impl, **unfused), mbs=1, gbs=8,
                   parallel={"use_distributed_optimizer": True}, train=train)
    target = Target(8, 8, 80 * 2**30, Hardware(989.0, 450.0, 50.0, 8))
    return plan_layout(job, Layout(8, 1, None, 1, 1, 8), target, sequence_parallel=True,
                       recompute=recompute)


def test_the_plan_counts_the_larger_of_the_activations_and_the_step_copy():
    local = _plan("local", "full").memory
    te = _plan("transformer_engine", "full").memory
    assert te.optimizer_step == 0          # TE's FusedAdam updates in place
    assert _plan("local", "full", fused_adam=True).memory.optimizer_step == 0   # torch's fused
    # fp32 master copy of the same elements: 4 of the optimizer's 12 bytes per element
    assert local.optimizer_step == local.optimizer // 3
    assert local.optimizer_step > local.activations     # full recompute keeps little
    state = local.weights + local.gradients + local.optimizer
    assert local.total == state + local.optimizer_step + local.buffers + local.allowance
    busy = _plan("local", None).memory                   # no recompute: activations dominate
    assert busy.activations > busy.optimizer_step
    assert busy.total == busy.weights + busy.gradients + busy.optimizer + busy.activations \
        + busy.buffers + busy.allowance
