"""Build the real megatron-core model, DDP and optimizer on CPU and measure what they allocate.

Always run as a script in processes of its own (it installs the CPU shim and forms a
process group, which must not happen inside the test runner): one process for world size 1,
or under ``torch.distributed.run`` for layouts that need several ranks::

    python tests/plan/megatron_probe.py CASES OUT
    python -m torch.distributed.run --nproc-per-node 4 tests/plan/megatron_probe.py CASES OUT

CASES is a JSON list of {"name", "job" (a job mapping), "tp", "pp", "vpp",
"measure_state" (default true), "measure_activations", "measure_peak", "measure_save" (a list
of optimizer formats)}; every rank writes its measurements to OUT.<rank>.json.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref

from hpctrain.runtime import cpu_shim

cpu_shim.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.transformer.module import Float16Module  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from hpctrain.config import Layout, job_from_mapping  # noqa: E402
from hpctrain.runtime.model import (build_model_and_optimizer, build_model_chunks,  # noqa: E402
                                    initialize_parallel, transformer_config)

# the models are tiny; one thread avoids spinning against the other ranks and test runs
torch.set_num_threads(1)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def init_process_group() -> None:
    if dist.is_initialized():
        return
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(29500 + os.getpid() % 2000))
    dist.init_process_group("gloo")


def _layout(job, tp: int, pp: int, vpp: int | None) -> Layout:
    dp = dist.get_world_size() // (tp * pp)
    return Layout(tp, pp, vpp, dp, job.batch.micro_batch_size, job.batch.global_batch_size)


def build(job, tp: int, pp: int, vpp: int | None):
    """Model chunks (DDP-wrapped) and the optimizer, as a training run builds them.

    fp32 jobs go through the runtime's own builder (what a CPU rehearsal runs). 16-bit
    parameters are what a GPU run holds but the CPU runtime never builds, so bf16/fp16 jobs
    get the runtime's TransformerConfig with 16-bit dtypes and megatron's Float16Module.
    """
    layout = _layout(job, tp, pp, vpp)
    parallel_state.destroy_model_parallel()
    initialize_parallel(layout, job.train.seed)
    if job.train.precision == "fp32":
        built = build_model_and_optimizer(job, layout, "cpu")
        return built.model, built.optimizer
    dtype = DTYPES[job.train.precision]
    config = transformer_config(job, layout, "cpu")
    config.params_dtype = config.pipeline_dtype = dtype
    config.bf16, config.fp16 = dtype == torch.bfloat16, dtype == torch.float16
    chunks = []
    for i, model in enumerate(build_model_chunks(job, layout, "cpu", config)):
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=job.train.grad_reduce_in_fp32,
            use_distributed_optimizer=job.parallel.use_distributed_optimizer)
        chunks.append(DistributedDataParallel(config, ddp_config, Float16Module(config, model),
                                              disable_bucketing=i > 0))
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-4, bf16=config.bf16, fp16=config.fp16,
        use_distributed_optimizer=job.parallel.use_distributed_optimizer), chunks)
    return chunks, optimizer


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _main_grads(optimizer) -> list[torch.Tensor]:
    """The gradients the optimizer's own (fp32 main) parameters hold right now."""
    return [p.grad for o in getattr(optimizer, "chained_optimizers", [optimizer])
            for group in o.optimizer.param_groups for p in group["params"]
            if p.grad is not None]


def measure_state(chunks, optimizer) -> dict:
    """Parameters, weight/gradient/optimizer bytes this rank allocated, after one real step;
    and the lifetime of the fp32 main gradients: none before the step, made by it, gone after
    the next ``zero_grad()`` (megatron's default ``set_to_none=True``, as the training loop
    calls it before each step's forward passes)."""
    for c in chunks:
        c.zero_grad_buffer()
    optimizer.zero_grad()
    before = len(_main_grads(optimizer))
    optimizer.step()   # zero gradients: Adam still creates its moments
    param_storages: dict[int, int] = {}
    params = 0
    names = []
    for c in chunks:
        for name, p in c.named_parameters():
            params += p.numel()
            names.append((name, p.numel()))
            ptr, nbytes = _storage(p)
            param_storages[ptr] = nbytes
    grad_bytes = sum(b.grad_data.nbytes for c in chunks for b in c.buffers)
    grad_storages = {_storage(b.grad_data)[0] for c in chunks for b in c.buffers}
    opt_storages: dict[int, int] = {}
    main_grads: dict[int, tuple[StorageWeakRef, int]] = {}
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    for o in inner:
        torch_opt = o.optimizer
        for group in torch_opt.param_groups:
            for p in group["params"]:
                tensors = [p] + [v for v in torch_opt.state[p].values()
                                 if torch.is_tensor(v) and v.dim() > 0]
                for t in tensors:
                    ptr, nbytes = _storage(t)
                    if ptr not in param_storages and ptr not in grad_storages:
                        opt_storages[ptr] = nbytes
                if p.grad is not None:
                    ptr, nbytes = _storage(p.grad)
                    if ptr not in param_storages and ptr not in grad_storages:
                        main_grads[ptr] = (StorageWeakRef(p.grad.untyped_storage()), nbytes)
    optimizer.zero_grad()
    gc.collect()
    alive = sum(n for ref, n in main_grads.values() if not ref.expired())
    return {"parameters": params, "names": names, "weight_bytes": sum(param_storages.values()),
            "grad_bytes": grad_bytes, "optimizer_bytes": sum(opt_storages.values()),
            "main_grad_bytes": sum(n for _, n in main_grads.values()),
            "main_grads_before_step": before, "main_grad_bytes_after_zero_grad": alive}


class _Saved:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class SavedActivations:
    """Bytes of the tensors the autograd graph keeps for backward: distinct storages saved by
    graph nodes that are still alive after the forward (parameters, gradient buffers and the
    inputs excluded). A tensor saved by a graph that was already thrown away (the inside of a
    recomputed checkpoint) is not counted."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.saved: list[tuple[weakref.ref, int, int]] = []

    def pack(self, t: torch.Tensor):
        holder = _Saved(t)
        ptr, nbytes = _storage(t)
        if ptr and ptr not in self.exclude:
            self.saved.append((weakref.ref(holder), ptr, nbytes))
        return holder

    @staticmethod
    def unpack(holder: _Saved) -> torch.Tensor:
        return holder.tensor

    def total(self) -> int:
        gc.collect()
        alive = {ptr: nbytes for ref, ptr, nbytes in self.saved if ref() is not None}
        return sum(alive.values())


def _inputs(job, micro_batch_size: int):
    s = job.model.seq_length
    torch.manual_seed(0)
    tokens = torch.randint(0, job.model.vocab_size, (micro_batch_size, s))
    position_ids = torch.arange(s).unsqueeze(0).expand(micro_batch_size, -1)
    return tokens, position_ids, None   # no mask, as the runtime: megatron builds the causal one


def measure_activations(chunks, job, micro_batch_size: int) -> dict:
    """Forward one microbatch with saved-tensor hooks, then backward (PP = 1 only)."""
    (model,) = chunks
    tokens, position_ids, mask = _inputs(job, micro_batch_size)
    exclude = {_storage(p)[0] for p in model.parameters()}
    exclude |= {_storage(b.grad_data)[0] for b in model.buffers}
    exclude |= {_storage(x)[0] for x in (tokens, position_ids)}
    saved = SavedActivations(exclude)
    model.zero_grad_buffer()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        loss = model(tokens, position_ids, mask, labels=tokens)
    stored = saved.total()
    loss.float().sum().backward()
    return {"activation_bytes": stored}


class LiveBytes(TorchDispatchMode):
    """Peak bytes of live tensors created while it is active (sampled after every op)."""

    def __init__(self, exclude: set[int]):
        super().__init__()
        self.exclude = exclude
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr and ptr not in self.live and ptr not in self.exclude:
                    self.live[ptr] = (StorageWeakRef(storage), storage.nbytes())
        for ptr in [p for p, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[ptr]
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


def measure_peak(chunks, job, micro_batch_size: int) -> int:
    """Peak bytes of everything a forward + backward allocates (PP = 1), parameters and the
    gradient buffers excluded: stored activations plus every transient."""
    (model,) = chunks
    tokens, position_ids, mask = _inputs(job, micro_batch_size)
    exclude = {_storage(p)[0] for p in model.parameters()}
    exclude |= {_storage(b.grad_data)[0] for b in model.buffers}
    model.zero_grad_buffer()
    mode = LiveBytes(exclude)
    with mode:
        loss = model(tokens, position_ids, mask, labels=tokens)
        loss.float().sum().backward()
    return mode.peak


def measure_save(chunks, optimizer, fmt: str) -> dict:
    """What building a checkpoint's optimizer state allocates, through the runtime's own code
    (``optimizer_sharded_state``, hpctrain's bucket re-alignment included): the bytes of the
    state it holds when done, and the peak of everything it allocated on the way (the CPU
    stands for both the GPU and the host here). Call after ``measure_state`` (Adam's state)."""
    from hpctrain.runtime.checkpoint.state import model_sharded_state, optimizer_sharded_state
    model_sd = model_sharded_state(chunks)
    exclude = set()
    for c in chunks:
        exclude |= {_storage(p)[0] for p in c.parameters()}
        exclude |= {_storage(b.grad_data)[0] for b in c.buffers}
        exclude |= {_storage(b.param_data)[0] for b in c.buffers if b.param_data is not None}
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        for group in o.optimizer.param_groups:
            for p in group["params"]:
                exclude.add(_storage(p)[0])
                exclude |= {_storage(v)[0] for v in o.optimizer.state[p].values()
                            if torch.is_tensor(v)}
    gc.collect()
    mode = LiveBytes(exclude)
    with mode:
        sd = optimizer_sharded_state(optimizer, model_sd, fmt)
    held = {}
    for leaf in torch.utils._pytree.tree_leaves(sd, is_leaf=lambda x: hasattr(x, "data")
                                                 and torch.is_tensor(getattr(x, "data", None))):
        t = getattr(leaf, "data", leaf)
        if torch.is_tensor(t):
            ptr, nbytes = _storage(t)
            if ptr and ptr not in exclude:
                held[ptr] = nbytes
    return {"held_bytes": sum(held.values()), "peak_bytes": mode.peak}


def run_cases(cases: list[dict]) -> list[dict]:
    init_process_group()
    # torch's and megatron's modules outlive every case: out of the collector's way, so that
    # each gc.collect() below walks only what the cases made
    gc.collect()
    gc.freeze()
    out = []
    for case in cases:
        job = job_from_mapping(case["job"], case["name"])
        chunks, optimizer = build(job, case["tp"], case["pp"], case.get("vpp"))
        result = {"name": case["name"], "rank": dist.get_rank(),
                  "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
                  "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
                  "dp_rank": parallel_state.get_data_parallel_rank(),
                  "dp": parallel_state.get_data_parallel_world_size()}
        if case.get("measure_activations"):
            result.update(measure_activations(chunks, job, job.batch.micro_batch_size))
        if case.get("measure_peak"):
            result["peak_bytes"] = measure_peak(chunks, job, job.batch.micro_batch_size)
        if case.get("measure_state", True):
            result.update(measure_state(chunks, optimizer))
        if case.get("measure_save"):
            result["save"] = {fmt: measure_save(chunks, optimizer, fmt)
                              for fmt in case["measure_save"]}
        out.append(result)
    return out


if __name__ == "__main__":
    cases_path, out_prefix = sys.argv[1], sys.argv[2]
    with open(cases_path) as f:
        results = run_cases(json.load(f))
    with open(f"{out_prefix}.{dist.get_rank()}.json", "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
