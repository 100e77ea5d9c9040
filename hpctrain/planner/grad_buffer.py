"""megatron-core's contiguous parameter/gradient buffer, laid out element for element.

``DistributedDataParallel`` packs every parameter of a model chunk into one flat gradient
buffer (``_ParamAndGradBuffer``), walking the parameters in reverse order. With the
distributed optimizer it also pads: each parameter starts at a multiple of 64 elements, each
bucket ends at a multiple of lcm(DP, 128) so it splits evenly over the DP ranks, and a tied
embedding weight on a pipeline end stage gets a bucket of its own. Each DP rank then owns one
contiguous 1/DP slice of every bucket and keeps fp32 main parameters and Adam moments only
for the parameter elements inside its slice (padding has no optimizer state).

This module replays that algorithm (megatron-core 0.16.1, ``param_and_grad_buffer.py`` and
``distrib_optimizer.py``) so the planner's gradient and optimizer bytes are exact.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass

from ..model_shape import ParamSpec

# megatron-core's default bucket size when overlap_grad_reduce is on (elements).
DEFAULT_BUCKET_ELEMENTS = 40_000_000


def _pad(n: int, divisor: int) -> int:
    return int(math.ceil(n / divisor) * divisor)


@dataclass(frozen=True)
class GradBufferLayout:
    numel: int                    # elements allocated, padding included
    numel_unpadded: int           # parameter elements
    buckets: tuple[tuple[int, int], ...]          # (start, end) of each bucket
    param_ranges: tuple[tuple[int, int], ...]     # (start, end) of each parameter

    def params_in_bucket(self, b_start: int, b_end: int) -> list[tuple[int, int]]:
        """The parameter ranges inside one bucket (a parameter never straddles buckets), found
        by bisection: the planner's cost stays linear in the parameters, whatever the number
        of buckets."""
        starts, ranges = self._sorted_ranges
        return ranges[bisect.bisect_left(starts, b_start):bisect.bisect_left(starts, b_end)]

    @functools.cached_property
    def _sorted_ranges(self) -> tuple[list[int], list[tuple[int, int]]]:
        ranges = sorted(self.param_ranges)
        return [r[0] for r in ranges], ranges

    def owned_per_rank(self, dp: int) -> list[int]:
        """Parameter elements whose optimizer state each DP rank keeps (dist-opt), for every
        rank in one sweep (O(parameters + DP) per bucket)."""
        owned = [0] * dp
        full = [0] * (dp + 1)     # difference array: ranks whose whole shard one param covers
        for b_start, b_end in self.buckets:
            shard = (b_end - b_start) // dp
            for p_start, p_end in self.params_in_bucket(b_start, b_end):
                lo, hi = max(p_start, b_start), min(p_end, b_end)
                if lo >= hi:
                    continue
                first, last = (lo - b_start) // shard, (hi - 1 - b_start) // shard
                if first == last:
                    owned[first] += hi - lo
                    continue
                owned[first] += b_start + (first + 1) * shard - lo
                owned[last] += hi - (b_start + last * shard)
                full[first + 1] += 1
                full[last] -= 1
            running = 0
            for r in range(dp):
                running += full[r]
                owned[r] += running * shard
                full[r] = 0
            full[dp] = 0
        return owned


def bucket_elements(overlap_grad_reduce: bool, dp: int, first_stage_first_chunk: bool,
                    bucket_size: int | None = None) -> int | None:
    """Bucket size as DistributedDataParallel picks it: one bucket unless gradient reduction
    overlaps the backward pass, and then only on the first pipeline stage's first chunk
    (``bucket_size``: the job's ``parallel.ddp_bucket_size``, else megatron's default)."""
    if not overlap_grad_reduce or not first_stage_first_chunk:
        return None
    return bucket_size or max(DEFAULT_BUCKET_ELEMENTS, 1_000_000 * dp)


def grad_buffer_layout(params: list[ParamSpec], dp: int, distributed_optimizer: bool,
                       bucket_size: int | None = None) -> GradBufferLayout:
    """Replay ``_ParamAndGradBuffer.__init__``'s index arithmetic for one model chunk."""
    end_divisor = math.lcm(dp, 128)
    buckets: list[tuple[int, int]] = []
    ranges: list[tuple[int, int]] = []
    state = {"bucket_start": 0, "bucket_params": 0}

    def close_bucket(param_end: int) -> int:
        end = _pad(param_end, end_divisor) if distributed_optimizer else param_end
        buckets.append((state["bucket_start"], end))
        state["bucket_start"], state["bucket_params"] = end, 0
        return end

    start = end = 0
    for p in reversed(params):
        if distributed_optimizer:
            start = _pad(start, 64)
        own_bucket = p.shared_embedding and distributed_optimizer
        if own_bucket and state["bucket_params"]:
            start = close_bucket(start)
        end = start + p.numel
        ranges.append((start, end))
        state["bucket_params"] += 1
        if (bucket_size is not None and end - state["bucket_start"] >= bucket_size) or own_bucket:
            start = close_bucket(end)
        else:
            start = end
    if state["bucket_params"]:
        close_bucket(end)
    numel = buckets[-1][1] if buckets else 0
    return GradBufferLayout(numel, sum(p.numel for p in params), tuple(buckets), tuple(ranges))
