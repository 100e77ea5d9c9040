"""A GPU kind's measured kernel table: what the step-time model and the memory allowance read.

One JSON file per GPU kind, written by the measurement (``hpctrain bench kernels`` on one GPU
of the cluster, or ``tools/gpu_check``'s ``kernels`` part) and read here without torch, so the
planner stays a pure-Python CLI. It holds:

* ``gemm``: seconds of one matrix multiply C[M,N] = A[M,K]·B[K,N] in the training dtype, on a
  full grid of M × N × K per operand layout, as megatron-core's linear layers call them:
  ``nt`` the forward (``input @ weight.t()``), ``nn`` the input gradient
  (``grad_output @ weight``), ``tn`` the weight gradient (``grad_output.t() @ input``). A
  shape between grid points is priced by its throughput (FLOP/s), interpolated linearly in
  log2(M), log2(N), log2(K) between the eight surrounding points; outside the grid the
  nearest edge's throughput is used. A grid point's own time is returned exactly. A layout
  the table lacks is priced from the ``nt`` grid.
* ``attention``: forward and backward seconds of one attention call per backend (the kernel
  megatron-core runs: ``local`` is its unfused DotProductAttention, ``flash``/``fused`` TE's
  or flash-attn's, ``torch-flash``/``torch-cudnn``/``torch-efficient`` torch's kernels under
  hpctrain's fused attention in the local spec), at measured (batch, heads, sequence, head
  size). Calls are independent
  per (batch × head), so the time scales with batch × heads; between measured sequence
  lengths it is interpolated in log-log (time grows between s and s² with the length).
* ``bandwidth_gbs``: device memory bandwidth a large copy reached (read + write bytes per s):
  the rate of element-wise, norm and optimizer work.
* ``memory``: what ``torch.cuda.max_memory_allocated`` does not see, measured while training:
  bytes used outside PyTorch's allocator (CUDA context, NCCL, library handles) and the
  allocator's slack (reserved minus allocated at the peak, as a fraction of the peak).
* ``host`` (optional): the host's time to issue one microbatch's forward and backward passes
  (``hpctrain.bench.host_issue``), per layer and per microbatch, for each kind of layer it
  measured (``local``: megatron-core's local spec as it comes; ``torch``: hpctrain's defaults,
  torch's fused attention); a step whose kernels take less than that is bound by the host.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import asdict, dataclass, field

FORMAT = "hpctrain-gpu-table/1"
GEMM_LAYOUTS = ("nt", "nn", "tn")   # forward, input gradient, weight gradient


class TableError(ValueError):
    """A table file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class AttentionPoint:
    backend: str
    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    forward_s: float
    backward_s: float


@dataclass(frozen=True)
class MemoryOverheads:
    outside_allocator_bytes: int
    allocator_slack_fraction: float


@dataclass(frozen=True)
class HostIssue:
    """Seconds the host takes to issue one microbatch's forward and backward passes: per
    transformer layer, and once per microbatch (embedding, output layer, loss, the schedule),
    by kind of layer (``HOST_KINDS``)."""

    per_layer_s: dict
    per_microbatch_s: dict

    def seconds(self, kind: str, layers: int) -> float | None:
        """One microbatch through ``layers`` layers of ``kind``; None when not measured."""
        if kind not in self.per_layer_s:
            return None
        return layers * self.per_layer_s[kind] + self.per_microbatch_s[kind]


HOST_KINDS = ("local", "torch")


def host_kind(attention_backend: str) -> str | None:
    """Which measured kind of layer stands for a job's attention: megatron-core's unfused
    ``local``, or torch's fused kernels in the local spec (``torch-*``); Transformer Engine's
    layers (``auto``, ``flash``, ``fused``, ``unfused``) are not measured (None)."""
    if attention_backend == "local":
        return "local"
    return "torch" if attention_backend.startswith("torch") else None


@dataclass(frozen=True)
class GpuTable:
    device: str                              # the GPU's name as torch reports it
    dtype: str                               # bfloat16, float16 or float32
    gemm: tuple[tuple[str, int, int, int, float], ...]  # (layout, M, N, K, seconds)
    attention: tuple[AttentionPoint, ...] = ()
    bandwidth_gbs: float | None = None
    memory: MemoryOverheads | None = None
    measured: dict = field(default_factory=dict)    # date, tool, versions: provenance
    source: str = ""                                # the file it was read from
    host: HostIssue | None = None                   # the host's time to issue the work

    def describe(self) -> str:
        when = self.measured.get("date", "date unknown")
        return f"{self.device} ({self.dtype}), measured {when}" + (
            f" ({self.source})" if self.source else "")

    # ------------------------------------------------------------------ GEMMs
    @functools.cached_property
    def _grids(self) -> dict:
        return {op: _grid([g[1:] for g in self.gemm if g[0] == op])
                for op in {g[0] for g in self.gemm}}

    def gemm_seconds(self, op: str, m: int, n: int, k: int) -> float:
        """Seconds of one GEMM of this operand layout and shape, from the table."""
        grids = self._grids
        axes, times = grids.get(op) or grids.get("nt") or next(iter(grids.values()))
        exact = times.get((m, n, k))
        if exact is not None:
            return exact
        point = (m, n, k)
        log_rate = 0.0
        corners = []
        for axis, x in zip(axes, point):
            corners.append(_bracket(axis, x))
        for im, wm in corners[0]:
            for i_n, wn in corners[1]:
                for ik, wk in corners[2]:
                    w = wm * wn * wk
                    if w == 0.0:
                        continue
                    gm, gn, gk = axes[0][im], axes[1][i_n], axes[2][ik]
                    log_rate += w * math.log2(2.0 * gm * gn * gk / times[(gm, gn, gk)])
        return 2.0 * m * n * k / 2.0 ** log_rate

    # ------------------------------------------------------------------ attention
    def attention_seconds(self, backend: str, batch: int, heads: int, seq: int,
                          head_dim: int) -> tuple[float, float] | None:
        """(forward, backward) seconds of one attention call, or None when the table has no
        measurement of this backend."""
        points = [p for p in self.attention if p.backend == backend]
        if not points:
            return None
        dims = sorted({p.head_dim for p in points}, key=lambda d: (abs(math.log2(d / head_dim)), d))
        same = sorted((p for p in points if p.head_dim == dims[0]), key=lambda p: p.seq)
        per_unit = [(p.seq, p.forward_s / (p.batch * p.heads), p.backward_s / (p.batch * p.heads),
                     p.head_dim) for p in same]
        fwd = _loglog(per_unit, seq, 1) * batch * heads
        bwd = _loglog(per_unit, seq, 2) * batch * heads
        scale = head_dim / dims[0]       # another head size: the work grows with it
        return fwd * scale, bwd * scale

    def to_json(self) -> dict:
        return {"format": FORMAT, "device": self.device, "dtype": self.dtype,
                "measured": self.measured,
                "gemm": [{"op": op, "m": m, "n": n, "k": k, "seconds": t}
                         for op, m, n, k, t in self.gemm],
                "attention": [asdict(p) for p in self.attention],
                "bandwidth_gbs": self.bandwidth_gbs,
                "memory": None if self.memory is None else asdict(self.memory),
                "host": None if self.host is None else asdict(self.host)}


def _grid(gemm):
    axes = tuple(sorted({p[i] for p in gemm}) for i in range(3))
    return axes, {(m, n, k): t for m, n, k, t in gemm}


def _bracket(axis: list[int], x: int) -> list[tuple[int, float]]:
    """Indexes of the grid values around ``x`` and their linear weights in log2 space
    (clamped to the grid's edges)."""
    if x <= axis[0]:
        return [(0, 1.0)]
    if x >= axis[-1]:
        return [(len(axis) - 1, 1.0)]
    hi = bisect.bisect_left(axis, x)
    lo = hi - 1
    f = (math.log2(x) - math.log2(axis[lo])) / (math.log2(axis[hi]) - math.log2(axis[lo]))
    return [(lo, 1.0 - f), (hi, f)]


def _loglog(points: list[tuple], seq: int, col: int) -> float:
    """Time per (batch × head) at ``seq``: log-log between the two measured lengths around it;
    beyond them the slope of the nearest two, kept between 1 (linear) and 2 (quadratic)."""
    seqs = [p[0] for p in points]
    if seq in seqs:
        return points[seqs.index(seq)][col]
    if len(points) == 1:
        return points[0][col] * (seq / seqs[0]) ** 2
    i = bisect.bisect_left(seqs, seq)
    lo, hi = (0, 1) if i == 0 else (len(points) - 2, len(points) - 1) if i >= len(points) \
        else (i - 1, i)
    (s0, t0), (s1, t1) = (points[lo][0], points[lo][col]), (points[hi][0], points[hi][col])
    slope = math.log(t1 / t0) / math.log(s1 / s0)
    if not lo < i <= hi:
        slope = min(2.0, max(1.0, slope))
    return t0 * (seq / s0) ** slope


def table_from_json(data: dict, source: str = "") -> GpuTable:
    """Validate a table's JSON; every problem is a ``TableError`` naming the field."""
    where = source or "kernel table"

    def fail(what: str) -> TableError:
        return TableError(f"{where}: {what}")

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise fail(f"format: expected {FORMAT!r} (write it with `hpctrain bench kernels`)")
    try:
        gemm = tuple((str(g.get("op", "nt")), int(g["m"]), int(g["n"]), int(g["k"]),
                      float(g["seconds"])) for g in data["gemm"])
        attention = tuple(AttentionPoint(str(a["backend"]), int(a["batch"]), int(a["heads"]),
                                         int(a["kv_heads"]), int(a["seq"]), int(a["head_dim"]),
                                         float(a["forward_s"]), float(a["backward_s"]))
                          for a in data.get("attention") or ())
        memory = data.get("memory")
        memory = None if memory is None else MemoryOverheads(
            int(memory["outside_allocator_bytes"]), float(memory["allocator_slack_fraction"]))
        bandwidth = data.get("bandwidth_gbs")
        bandwidth = None if bandwidth is None else float(bandwidth)
        measured = data.get("measured") or {}
        if not isinstance(measured, dict):
            raise TypeError(f"measured is a JSON {type(measured).__name__}, expected an object")
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise fail(f"malformed entry ({type(e).__name__}: {e})") from None
    host = _host_from_json(data.get("host"), fail)
    numbers = [t for *_, t in gemm] + [x for p in attention for x in (p.forward_s, p.backward_s)]
    numbers += [] if bandwidth is None else [bandwidth]
    numbers += [] if memory is None else [memory.allocator_slack_fraction]
    if not all(math.isfinite(x) for x in numbers):
        raise fail("every time, bandwidth and fraction must be a finite number (not NaN or "
                   "Infinity)")
    if not all(1e-9 <= x <= 1e6 for x in [t for *_, t in gemm] + [
            x for p in attention for x in (p.forward_s, p.backward_s)]):
        raise fail("every time must be between 1e-9 and 1e6 seconds")
    if bandwidth is not None and not 1e-3 <= bandwidth <= 1e6:
        raise fail("bandwidth_gbs: must be between 0.001 and 1e6 GB/s")
    sizes = [x for _, m, n, k, _t in gemm for x in (m, n, k)] + [
        x for p in attention for x in (p.batch, p.heads, p.kv_heads, p.seq, p.head_dim)]
    if any(x > 1 << 31 for x in sizes):
        raise fail("sizes must be at most 2**31")
    seen = set()
    for p in attention:
        key = (p.backend, p.head_dim, p.seq)
        if key in seen:
            raise fail(f"attention: {p.backend} is measured twice at head_dim {p.head_dim}, "
                       f"seq {p.seq}; keep one")
        seen.add(key)
    if not gemm:
        raise fail("gemm: no measurements")
    if any(min(m, n, k) < 1 or not t > 0 for _, m, n, k, t in gemm):
        raise fail("gemm: sizes must be positive and seconds above zero")
    unknown = {g[0] for g in gemm} - set(GEMM_LAYOUTS)
    if unknown:
        raise fail(f"gemm: unknown op {sorted(unknown)[0]!r} (one of {', '.join(GEMM_LAYOUTS)})")
    for op in sorted({g[0] for g in gemm}):
        axes, times = _grid([g[1:] for g in gemm if g[0] == op])
        missing = [(m, n, k) for m in axes[0] for n in axes[1] for k in axes[2]
                   if (m, n, k) not in times]
        if missing:
            raise fail(f"gemm: op {op} is not a full M × N × K grid ({len(missing)} shapes "
                       f"missing, e.g. {missing[0]})")
    if any(not (p.forward_s > 0 and p.backward_s > 0) or min(p.batch, p.heads, p.seq,
                                                              p.head_dim) < 1 for p in attention):
        raise fail("attention: sizes must be positive and seconds above zero")
    if bandwidth is not None and not bandwidth > 0:
        raise fail("bandwidth_gbs: must be above zero")
    if memory is not None and (memory.outside_allocator_bytes < 0
                               or not 0 <= memory.allocator_slack_fraction < 1):
        raise fail("memory: outside_allocator_bytes ≥ 0 and 0 ≤ allocator_slack_fraction < 1")
    from .file_door import show   # text from the file is printed in plan's lines
    measured = {k: (show(v, 60) if isinstance(v, str) else v) for k, v in measured.items()}
    return GpuTable(show(str(data.get("device", "unknown")), 80),
                    show(str(data.get("dtype", "unknown")), 40), gemm,
                    attention, bandwidth, memory, measured, source, host)


def _host_from_json(host, fail) -> HostIssue | None:
    """The ``host`` section: absent or null, or per kind of layer (``HOST_KINDS``) a time
    per layer and per microbatch, each a finite number of seconds, at most one second per
    layer (a host a thousand times slower than measured ones is a wrong unit, not a host)."""
    if host is None:
        return None
    if not isinstance(host, dict) or set(host) != {"per_layer_s", "per_microbatch_s"}:
        raise fail("host: expected {\"per_layer_s\": {KIND: seconds}, \"per_microbatch_s\": "
                   "{KIND: seconds}} (write it with `hpctrain bench kernels`), or null")
    parts = {}
    for name in ("per_layer_s", "per_microbatch_s"):
        part = host[name]
        if not isinstance(part, dict) or not part or set(part) - set(HOST_KINDS):
            raise fail(f"host.{name}: expected an object of seconds by kind of layer "
                       f"({', '.join(HOST_KINDS)})")
        for kind, value in part.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not (math.isfinite(value) and 0 <= value <= 1.0):
                raise fail(f"host.{name}.{kind}: expected seconds from 0 to 1, got "
                           f"{show_value(value)}")
        parts[name] = {kind: float(value) for kind, value in part.items()}
    if set(parts["per_layer_s"]) != set(parts["per_microbatch_s"]):
        raise fail("host: per_layer_s and per_microbatch_s must name the same kinds of layer")
    return HostIssue(parts["per_layer_s"], parts["per_microbatch_s"])


def show_value(value) -> str:
    from .file_door import show
    return show(repr(value), 40)
