"""Bus bandwidth as nccl-tests defines it, and what a profile expects.

algbw = S / t (bytes of the buffer over the time of one all-reduce); for all-reduce
busbw = algbw * 2(n-1)/n, the per-link rate a ring needs, comparable to the hardware's link
speed whatever the rank count (nccl-tests doc/PERFORMANCE.md). GB here is 1e9 bytes, as there.
"""

from __future__ import annotations


def algbw(size_bytes: float, seconds: float) -> float:
    """GB/s."""
    return size_bytes / seconds / 1e9


def busbw(alg_gbs: float, nranks: int) -> float:
    """All-reduce bus bandwidth (GB/s) for ``nranks`` ranks."""
    if nranks < 2:
        return 0.0
    return alg_gbs * 2 * (nranks - 1) / nranks


def default_sizes_mb(device: str) -> list[float]:
    if device == "cuda":
        return [1, 4, 16, 64, 256, 1024]
    return [0.25, 1, 4, 16]


def expected_busbw(profile, inter_node: bool) -> float | None:
    ic = profile.interconnect
    return ic.inter_node_busbw_gbs if inter_node else ic.intra_node_busbw_gbs


def threshold(profile, inter_node: bool) -> float | None:
    e = expected_busbw(profile, inter_node)
    return e * profile.interconnect.min_bandwidth_fraction if e else None
