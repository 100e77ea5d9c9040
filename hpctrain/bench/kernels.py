"""Measure a GPU kind's kernel table (``hpctrain.gpu_table``): what the planner's step time and
memory allowance read, in the package's format, ready for a profile's ``node.kernel_table``.

Run on one GPU of the kind (``hpctrain bench kernels -o table.json``, in a job on the
cluster, or ``tools/gpu_check``'s ``kernels`` part). Every kernel is the one megatron-core
runs:

* GEMMs: ``torch.matmul`` in the training dtype, in the three operand layouts of a linear
  layer (forward ``x @ w.t()``, input gradient ``dy @ w``, weight gradient ``dy.t() @ x``),
  on a full M × N × K grid;
* attention: megatron-core's own ``DotProductAttention`` (``local``), hpctrain's torch fused
  attention in the local spec (``runtime.fused_attention``) with one torch kernel forced at a
  time (``torch-flash``, ``torch-cudnn``, ``torch-efficient``: what runs without Transformer
  Engine) and Transformer Engine's ``DotProductAttention`` with one backend forced at a time
  (``flash``, ``fused``, ``unfused``; each in a process of its own, since TE picks its backend
  once per process from ``NVTE_*_ATTN``), causal, forward and backward, at several sequence
  lengths and head sizes;
* bandwidth: a large device-to-device copy (read + write bytes per second);
* memory overheads, from a training process (``memory_overheads``): what the process uses
  outside PyTorch's allocator, and the allocator's slack at the peak;
* the host's time to issue a layer's and a microbatch's work (``host_issue``): hpctrain's
  build of the model at tiny widths, for each kind of layer the planner tells apart.

On a GPU each kernel is timed with CUDA events (median of the repeats after a warm-up); on
the CPU (the tests' tables) with the process clock's minimum over repeats, the estimate least
disturbed by other load.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

from ..gpu_table import FORMAT, GEMM_LAYOUTS, HOST_KINDS

DTYPES = ("bfloat16", "float16", "float32")
GPU_GRID = (512, 1024, 2048, 4096, 8192, 16384)
GPU_ATTENTION = [dict(batch=1, heads=16, kv_heads=16, seq=s, head_dim=d)
                 for d in (64, 128) for s in (1024, 2048, 4096, 8192)]
TE_BACKENDS = ("flash", "fused", "unfused")
# hpctrain's fused attention in the local spec, one torch kernel at a time (the table's names:
# gpu_table.TORCH_ATTENTION; the CPU has the flash kernel only)
TORCH_BACKENDS = ("torch-flash", "torch-cudnn", "torch-efficient")
TE_SWITCHES = {"flash": ("1", "0", "0"), "fused": ("0", "1", "0"), "unfused": ("0", "0", "1")}


def _torch_dtype(name: str):
    import torch
    return getattr(torch, name)


class Timer:
    """Seconds of a callable: CUDA events and the median on a GPU, the minimum of the process
    clock on the CPU."""

    def __init__(self, device: str, repeats: int = 5, warmup: int = 2):
        self.device, self.repeats, self.warmup = device, repeats, warmup

    def __call__(self, fn) -> float:
        return self.after(lambda: None, lambda _: fn())

    def after(self, setup, fn) -> float:
        """Seconds of ``fn(setup())``, ``setup`` untimed (a backward pass after its forward)."""
        import torch
        for _ in range(self.warmup):
            fn(setup())
        times = []
        for _ in range(self.repeats):
            x = setup()
            if self.device == "cuda":
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(x)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - t0)
        return statistics.median(times) if self.device == "cuda" else min(times)


def gemm_operands(op: str, m: int, n: int, k: int, dtype, device: str):
    """Operands laid out as a linear layer's GEMM of this kind holds them."""
    import torch
    gen = dict(dtype=dtype, device=device)
    if op == "nt":      # input [M, K] @ weight[N, K].t()
        return torch.randn(m, k, **gen), torch.randn(n, k, **gen).t()
    if op == "nn":      # grad_output [M, K] @ weight [K, N]
        return torch.randn(m, k, **gen), torch.randn(k, n, **gen)
    if op == "tn":      # grad_output[K, M].t() @ input [K, N]
        return torch.randn(k, m, **gen).t(), torch.randn(k, n, **gen)
    raise ValueError(f"unknown GEMM layout {op!r}")


def time_gemm(timer: Timer, op: str, m: int, n: int, k: int, dtype, device: str) -> float:
    import torch
    a, b = gemm_operands(op, m, n, k, dtype, device)
    out = torch.empty(m, n, dtype=dtype, device=device)
    return timer(lambda: torch.matmul(a, b, out=out))


def measure_gemms(device: str, dtype, grid, ops=GEMM_LAYOUTS, timer: Timer | None = None,
                  deadline: float | None = None) -> list[dict]:
    timer = timer or Timer(device)
    rows = []
    for op in ops:
        for m in grid:
            for n in grid:
                for k in grid:
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(f"GEMM grid not finished ({len(rows)} shapes timed)")
                    rows.append({"op": op, "m": m, "n": n, "k": k,
                                 "seconds": time_gemm(timer, op, m, n, k, dtype, device)})
    return rows


def measure_bandwidth(device: str, dtype, nbytes: int = 2**30, timer: Timer | None = None) -> float:
    """GB/s of a device copy: bytes read + bytes written per second."""
    import torch
    timer = timer or Timer(device)
    elements = nbytes // torch.empty((), dtype=dtype).element_size()
    src = torch.empty(elements, dtype=dtype, device=device).normal_()
    dst = torch.empty_like(src)
    seconds = timer(lambda: dst.copy_(src))
    return 2 * elements * src.element_size() / seconds / 1e9


# ----------------------------------------------------------------------------- attention
def _init_parallel_state(device: str) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            from ..identity import free_port
            os.environ["MASTER_PORT"] = str(free_port("127.0.0.1"))
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    model_parallel_cuda_manual_seed(1234)   # the CPU shim gives it a CPU generator
    torch.manual_seed(1234)


def _attention_config(point: dict, dtype):
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(
        num_layers=1, hidden_size=point["heads"] * point["head_dim"],
        num_attention_heads=point["heads"], num_query_groups=point["kv_heads"],
        kv_channels=point["head_dim"], attention_dropout=0.0, hidden_dropout=0.0,
        params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        masked_softmax_fusion=False, apply_query_key_layer_scaling=False)


def time_local_attention(timer: Timer, point: dict, dtype, device: str) -> tuple[float, float]:
    """Forward and backward seconds of megatron-core's own DotProductAttention (causal)."""
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    _init_parallel_state(device)
    module = DotProductAttention(_attention_config(point, dtype), layer_number=1,
                                 attn_mask_type=AttnMaskType.causal, attention_type="self")
    module.to(device)
    return _time_attention(timer, module, point, dtype, device, local=True)


def time_torch_attention(timer: Timer, point: dict, dtype, device: str,
                         backend: str) -> tuple[float, float]:
    """Forward and backward seconds of hpctrain's fused attention (the local spec's
    ``core_attention`` without Transformer Engine) with one torch kernel allowed."""
    from megatron.core.transformer.enums import AttnMaskType

    from ..runtime import fused_attention as fa
    _init_parallel_state(device)
    kernel = fa.kernels_by_name([backend.removeprefix("torch-")])
    module = fa.TorchFusedAttention(_attention_config(point, dtype), layer_number=1,
                                    attn_mask_type=AttnMaskType.causal, attention_type="self",
                                    kernels=kernel)
    module.to(device)
    return _time_attention(timer, module, point, dtype, device, local=True)


def time_te_attention(timer: Timer, point: dict, dtype, device: str) -> tuple[float, float]:
    """Forward and backward seconds of Transformer Engine's DotProductAttention with the
    backend this process's ``NVTE_*_ATTN`` switches allow."""
    from transformer_engine.pytorch import DotProductAttention
    module = DotProductAttention(point["heads"], point["head_dim"],
                                 num_gqa_groups=point["kv_heads"], attention_dropout=0.0,
                                 attn_mask_type="causal", qkv_format="sbhd")
    module.to(device)
    return _time_attention(timer, module, point, dtype, device, local=False)


def _time_attention(timer, module, point, dtype, device, local: bool) -> tuple[float, float]:
    """As the runtime calls it: megatron's local attention gets no mask (causal by its type,
    it builds its own), TE's is causal by construction."""
    import torch
    s, b, d = point["seq"], point["batch"], point["head_dim"]
    q = torch.randn(s, b, point["heads"], d, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(s, b, point["kv_heads"], d, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(s, b, point["kv_heads"], d, dtype=dtype, device=device, requires_grad=True)

    def call():
        return module(q, k, v, None) if local else module(q, k, v)

    def forward():
        with torch.no_grad():
            return call()

    def backward(out):
        out.backward(torch.ones_like(out))
        q.grad = k.grad = v.grad = None

    return timer(forward), timer.after(call, backward)


def measure_attention(device: str, dtype, points, backends, timer: Timer | None = None,
                      deadline: float | None = None) -> tuple[list[dict], list[str]]:
    """Attention rows for each backend that runs here, and why the others did not."""
    timer = timer or Timer(device)
    rows, skipped = [], []
    for backend in backends:
        if backend == "local":
            for point in points:
                if deadline is not None and time.monotonic() > deadline:
                    skipped.append("local: out of time")
                    break
                fwd, bwd = time_local_attention(timer, point, dtype, device)
                rows.append({"backend": "local", **point, "forward_s": fwd, "backward_s": bwd})
            continue
        if backend in TORCH_BACKENDS:
            got, why = _torch_attention(timer, backend, points, dtype, device, deadline)
            rows += got
            if why:
                skipped.append(f"{backend}: {why}")
            continue
        got, why = _te_attention_in_child(backend, device, dtype, points, deadline)
        rows += got
        if why:
            skipped.append(f"{backend}: {why}")
    return rows, skipped


def _torch_attention(timer, backend, points, dtype, device, deadline):
    """One torch kernel's rows; a kernel this GPU, dtype or head size cannot run is a reason
    (its first line), not a failure of the table."""
    rows = []
    for point in points:
        if deadline is not None and time.monotonic() > deadline:
            return rows, "out of time"
        try:
            fwd, bwd = time_torch_attention(timer, point, dtype, device, backend)
        except RuntimeError as e:
            return rows, (str(e).strip().splitlines() or ["failed"])[0][:200]
        rows.append({"backend": backend, **point, "forward_s": fwd, "backward_s": bwd})
    return rows, ""


def _te_attention_in_child(backend: str, device: str, dtype, points, deadline):
    """One TE backend, measured in a process of its own with only that backend allowed."""
    flash, fused, unfused = TE_SWITCHES[backend]
    env = {**os.environ, "NVTE_FLASH_ATTN": flash, "NVTE_FUSED_ATTN": fused,
           "NVTE_UNFUSED_ATTN": unfused}
    left = None if deadline is None else max(1.0, deadline - time.monotonic())
    args = json.dumps({"backend": backend, "device": device, "dtype": str(dtype).split(".")[-1],
                       "points": points})
    try:
        proc = subprocess.run([sys.executable, "-m", "hpctrain.bench.kernels", "te-attention",
                               args], capture_output=True, text=True, env=env, timeout=left)
    except subprocess.TimeoutExpired:
        return [], "out of time"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return [], last[-200:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), ""


def _te_attention_main(spec: dict) -> None:
    import transformer_engine  # noqa: F401  (fails here, not in the parent, without TE)
    device, dtype = spec["device"], _torch_dtype(spec["dtype"])
    timer = Timer(device)
    rows = []
    for point in spec["points"]:
        fwd, bwd = time_te_attention(timer, point, dtype, device)
        rows.append({"backend": spec["backend"], **point, "forward_s": fwd, "backward_s": bwd})
    print(json.dumps(rows))


# ----------------------------------------------------------------------------- memory
def memory_overheads() -> dict | None:
    """After training in this process: bytes used on the GPU outside PyTorch's allocator
    (``mem_get_info``'s used minus ``memory_reserved``: the CUDA context, NCCL, libraries) and
    the allocator's slack at the peak (``max_memory_reserved`` over ``max_memory_allocated``,
    minus one). None on the CPU."""
    import torch
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    outside = max(0, total - free - torch.cuda.memory_reserved())
    peak = torch.cuda.max_memory_allocated()
    slack = torch.cuda.max_memory_reserved() / peak - 1 if peak else 0.0
    return {"outside_allocator_bytes": int(outside), "allocator_slack_fraction": max(0.0, slack)}


# ----------------------------------------------------------------------------- the table
def versions() -> dict:
    import torch
    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import transformer_engine
        out["transformer_engine"] = getattr(transformer_engine, "__version__", "unknown")
    except Exception:   # noqa: BLE001 - a version for the record only
        out["transformer_engine"] = None
    return out


def measure_table(*, device: str = "cuda", dtype: str = "bfloat16", grid=GPU_GRID,
                  attention=GPU_ATTENTION, backends=("local",) + TORCH_BACKENDS + TE_BACKENDS,
                  memory: dict | None = None, tool: str = "hpctrain bench kernels",
                  budget_s: float | None = None, timer: Timer | None = None,
                  host_kinds=HOST_KINDS) -> dict:
    """Measure this machine's table; returns its JSON (``gpu_table.table_from_json`` reads
    it). ``memory``: overheads measured while training (``memory_overheads``), if any;
    ``host_kinds``: the kinds of layer whose issue time is measured (none: no host section)."""
    import torch
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
    torch_dtype = _torch_dtype(dtype)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    timer = timer or Timer(device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    started = time.monotonic()
    gemm = measure_gemms(device, torch_dtype, grid, timer=timer, deadline=deadline)
    bandwidth = measure_bandwidth(device, torch_dtype, 2**30 if device == "cuda" else 2**26,
                                  timer=timer)
    rows, skipped = measure_attention(device, torch_dtype, attention, backends, timer=timer,
                                      deadline=deadline)
    host = measure_host(device, host_kinds, deadline) if host_kinds else None
    measured = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "tool": tool,
                "seconds": round(time.monotonic() - started, 1), **versions()}
    if skipped:
        measured["attention_not_measured"] = skipped
    return {"format": FORMAT, "device": name, "dtype": dtype, "measured": measured,
            "gemm": gemm, "attention": rows, "bandwidth_gbs": bandwidth, "memory": memory,
            "host": host}


def measure_host(device: str, kinds=HOST_KINDS, deadline: float | None = None) -> dict | None:
    """The table's ``host`` section (``host_issue.measure_host_issue``), on this process's
    parallel state."""
    from .host_issue import measure_host_issue
    _init_parallel_state(device)
    return measure_host_issue(device, kinds, deadline)


def add_host(path, device: str) -> None:
    """Measure the host section into an existing table file that has none (tools/gpu_check
    with a table measured before: the host of this machine, without the GEMM grid again)."""
    from ..outputs import write_atomic
    table = json.loads(open(path, encoding="utf-8").read())
    if table.get("host") is None:
        table["host"] = measure_host(device)
        write_atomic(path, json.dumps(table, indent=1) + "\n")


def write_table(table: dict, path) -> None:
    """Write a table where nothing else is, through the write door: a unique temporary name,
    then a link that fails if the file appeared meanwhile (an existing table is never
    replaced: ``FileExistsError``)."""
    from ..outputs import write_atomic
    write_atomic(path, json.dumps(table, indent=1) + "\n", exclusive=True)


def main(argv: list[str]) -> int:
    """``te-attention SPEC``: one TE backend's attention rows on stdout (a child of
    ``measure_attention``); ``table SPEC FILE``: a whole table into FILE (tools/gpu_check)."""
    if argv[:1] == ["te-attention"]:
        _te_attention_main(json.loads(argv[1]))
        return 0
    if argv[:1] in (["table"], ["host"]) and len(argv) == 3:
        spec = json.loads(argv[1])
        if spec.get("device") == "cpu":
            from ..runtime import cpu_shim
            cpu_shim.install()
        if argv[0] == "host":
            add_host(argv[2], spec.get("device", "cuda"))
        else:
            write_table(measure_table(**spec), argv[2])
        return 0
    print("usage: python -m hpctrain.bench.kernels te-attention SPEC | table SPEC FILE | "
          "host SPEC FILE (internal; use `hpctrain bench kernels`)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
