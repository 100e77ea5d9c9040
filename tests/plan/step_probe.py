"""Measure a CPU kernel table and a real megatron-core training step on it, in one process.

Run as a script (it installs the CPU shim and forms a one-rank process group)::

    python tests/plan/step_probe.py JOB_JSON GRID_JSON OUT

Writes OUT (JSON): the kernel table measured here (``hpctrain.bench.kernels.measure_table``
on the CPU, fp32), every matrix multiply one training step of the job's model runs (operand
layout and shape, as ``aten.mm`` sees them) with the least time each call took over the
repeated steps, and the least time of a whole step (forward, backward, optimizer). Table and
step are measured alternately, so both see the same load on the machine.
"""

from __future__ import annotations

import json
import os
import sys
import time

from hpctrain.runtime import cpu_shim

cpu_shim.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from hpctrain.bench.kernels import Timer, measure_table  # noqa: E402
from hpctrain.config import Layout, job_from_mapping  # noqa: E402
from hpctrain.runtime.model import build_model_and_optimizer, initialize_parallel  # noqa: E402

torch.set_num_threads(1)
STEPS = 5


def layout_of(t: torch.Tensor) -> str:
    """n: rows contiguous; t: a transposed view (what ``.t()`` hands to mm)."""
    return "t" if t.dim() == 2 and t.stride(0) == 1 and t.stride(1) != 1 else "n"


class GemmTimes(TorchDispatchMode):
    """Every ``aten.mm`` of a step: (layout, M, N, K) and its wall time."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[tuple, float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            a, b = args[0], args[1]
            t0 = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            self.calls.append(((layout_of(a) + layout_of(b), a.shape[0], b.shape[1],
                                a.shape[1]), time.perf_counter() - t0))
            return out
        return func(*args, **(kwargs or {}))


def main(job_path: str, grid_path: str, out_path: str) -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
    dist.init_process_group("gloo")
    job = job_from_mapping(json.loads(open(job_path).read()), "step-probe")
    spec = json.loads(open(grid_path).read())
    layout = Layout(1, 1, None, 1, job.batch.micro_batch_size, job.batch.global_batch_size)
    initialize_parallel(layout, job.train.seed)
    built = build_model_and_optimizer(job, layout, "cpu")
    (model,) = built.model
    s, b = job.model.seq_length, job.batch.micro_batch_size
    tokens = torch.randint(0, job.model.vocab_size, (b, s))
    position_ids = torch.arange(s).unsqueeze(0).expand(b, -1)

    def step(mode=None):
        model.zero_grad_buffer()
        built.optimizer.zero_grad()
        t0 = time.perf_counter()
        if mode is None:
            loss = model(tokens, position_ids, None, labels=tokens)
            loss.float().sum().backward()
        else:
            with mode:
                loss = model(tokens, position_ids, None, labels=tokens)
                loss.float().sum().backward()
        built.optimizer.step()
        return time.perf_counter() - t0

    timer = Timer("cpu", repeats=spec.get("repeats", 3), warmup=1)
    step()                                            # first step: Adam's state, caches
    best_step, per_call, calls = float("inf"), None, None
    table = None
    for i in range(STEPS):
        best_step = min(best_step, step())
        mode = GemmTimes()
        step(mode)
        if per_call is None:
            calls = [c for c, _ in mode.calls]
            per_call = [t for _, t in mode.calls]
        else:
            per_call = [min(a, t) for a, (_, t) in zip(per_call, mode.calls)]
        if i in (0, STEPS // 2):                       # the table between the steps
            measured = measure_table(device="cpu", dtype="float32", grid=spec["grid"],
                                     attention=spec["attention"], backends=("local",),
                                     timer=timer, tool="tests/plan/step_probe.py",
                                     host_kinds=())
            table = measured if table is None else _faster(table, measured)
    with open(out_path, "w") as f:
        json.dump({"table": table, "gemm_calls": calls, "gemm_seconds": per_call,
                   "step_seconds": best_step}, f)
    dist.destroy_process_group()


def _faster(a: dict, b: dict) -> dict:
    """Two measurements of the same table: the lesser time of each kernel."""
    out = dict(a)
    out["gemm"] = [dict(x, seconds=min(x["seconds"], y["seconds"]))
                   for x, y in zip(a["gemm"], b["gemm"])]
    out["attention"] = [dict(x, forward_s=min(x["forward_s"], y["forward_s"]),
                             backward_s=min(x["backward_s"], y["backward_s"]))
                        for x, y in zip(a["attention"], b["attention"])]
    out["bandwidth_gbs"] = max(a["bandwidth_gbs"], b["bandwidth_gbs"])
    return out


if __name__ == "__main__":
    main(*sys.argv[1:4])
