"""The few collectives the runtime itself issues (megatron issues the rest).

Kept to one small module so each use is visible: one float64 all-reduce per step carries the
step loss and every flag the ranks must agree on; objects (paths, verification results) go
through broadcast/all-gather of Python objects, only outside the step.
"""

from __future__ import annotations


def _device(device: str):
    import torch
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else None


def sum_floats(values: list[float], device: str) -> list[float]:
    """Element-wise sum over all ranks (float64)."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64, device=_device(device))
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def broadcast_object(obj, src: int = 0):
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj) -> list:
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    import torch.distributed as dist
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
