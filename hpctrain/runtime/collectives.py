"""The few collectives the runtime itself issues (megatron issues the rest).

Kept to one small module so each use is visible: one float64 all-reduce per step carries the
step loss and every flag the ranks must agree on, started asynchronously (:func:`start_sum`)
and read only after megatron-core's optimizer has synchronised with the device anyway;
objects (paths, verification results) go through broadcast/all-gather of Python objects,
only outside the step.
"""

from __future__ import annotations


def start_sum(t):
    """Start an element-wise sum of tensor ``t`` over all ranks, in place and asynchronously;
    returns a function that waits for it and gives the sums as Python floats. On a GPU the
    wait only orders the device streams; the host waits once, for the values."""
    import torch.distributed as dist
    work = None
    if dist.is_initialized() and dist.get_world_size() > 1:
        work = dist.all_reduce(t, async_op=True)

    def result() -> list[float]:
        if work is not None:
            work.wait()
        return t.tolist()

    return result


def broadcast_object(obj, src: int = 0):
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def on_rank0(work, is_rank0: bool):
    """``work()`` on rank 0 alone; every rank returns its result, or raises the error it raised.

    What rank 0 does alone on the way to a collective (list a checkpoint folder that another
    run may be changing, move a damaged checkpoint aside, write the run's events on a full
    disk) must end the same way on every rank: a rank that raises alone leaves the others
    waiting in the next collective until a timeout. The error travels pickled; one that does
    not survive pickling arrives as a RuntimeError with its type and message."""
    import pickle
    outcome = error = None
    if is_rank0:
        try:
            outcome = (True, work())
        except Exception as e:  # noqa: BLE001 - every rank must hear it
            error = e
            try:
                outcome = (False, pickle.loads(pickle.dumps(e)))  # as the others will see it
            except Exception:  # noqa: BLE001
                outcome = (False, RuntimeError(f"{type(e).__name__}: {e}"))
    ok, value = broadcast_object(outcome)
    if ok:
        return value
    if error is not None:
        raise error
    raise value


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


def all_gather_floats(values: list[float], device: str = "cpu") -> list[list[float]]:
    """Every rank's ``values`` (the same length on every rank), as one small float64
    all-gather on the world group: rank r's list is element r."""
    import torch
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [list(values)]
    where = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else "cpu"
    mine = torch.tensor(values, dtype=torch.float64, device=where)
    out = torch.empty(dist.get_world_size() * len(values), dtype=torch.float64, device=where)
    dist.all_gather_into_tensor(out, mine)
    flat = out.tolist()
    return [flat[i:i + len(values)] for i in range(0, len(flat), len(values))]
