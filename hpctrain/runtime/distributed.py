"""Device choice and the process group: the one place that decides cuda vs cpu.

* cuda + NCCL when the profile says ``node.device: cuda`` and torch sees a GPU; cpu + gloo
  when the profile says ``cpu`` (the rehearsal), after installing the CPU shim — before
  megatron is imported. A cuda profile on a machine without a GPU is an error, not a silent
  fallback.
* The rendezvous is bounded: rank 0 serves a TCP store at MASTER_ADDR:MASTER_PORT and waits
  at most ``train.init_timeout_s`` for every rank to reach it; the others give up as long
  after failing to connect. The error names the address, the rank and the world size, so a
  wrong address or a missing rank is a message, not a hang. Collectives afterwards use
  megatron's own (long) timeout: a checkpoint save may legitimately take minutes.
"""

from __future__ import annotations

import datetime
import os

from ..errors import HpcTrainError
from ..identity import RankEnv

COLLECTIVE_TIMEOUT_MIN = 30


class RendezvousError(HpcTrainError):
    """The ranks did not meet."""


def choose_device(profile) -> str:
    import torch
    wanted = profile.node.device
    if wanted == "cuda":
        if not torch.cuda.is_available():
            raise HpcTrainError(f"profile {profile.name!r} says node.device: cuda but torch sees no "
                                f"GPU on this node (torch {torch.__version__}); check the node, "
                                f"CUDA_VISIBLE_DEVICES and the torch build, or use a cpu profile")
        return "cuda"
    return "cpu"


def set_device_connections(layout, environ=None) -> str | None:
    """``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor parallelism, before CUDA starts (it is read
    when the CUDA context is created). One hardware queue makes the GPU run kernels in the
    order they were issued, so a TP (or sequence-parallel) communication kernel issued before
    a GEMM is scheduled before it and the two overlap as megatron-core plans; Megatron-LM
    refuses to run TP on GPUs before Blackwell without it. A value the profile's ``env`` sets
    is kept; returns a note when it differs."""
    environ = os.environ if environ is None else environ
    if layout.tensor_model_parallel_size <= 1:
        return None
    value = environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    if value != "1":
        return (f"CUDA_DEVICE_MAX_CONNECTIONS={value} from the environment is kept; with "
                f"tensor parallelism Megatron-LM requires 1 (before Blackwell GPUs) so that "
                f"communication overlaps compute in the intended order")
    return None


def prepare_device(device: str, env: RankEnv) -> None:
    """Bind this rank to its GPU, or set the CPU rehearsal up (shim, threads)."""
    import torch
    if device == "cuda":
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
        return
    from . import cpu_shim
    cpu_shim.install()
    if "OMP_NUM_THREADS" not in os.environ:
        # One intra-op thread per rank: the rehearsal's matrices are small, and OpenMP workers
        # spinning on a shared or oversubscribed machine made steps 15x slower in our runs.
        torch.set_num_threads(1)


def init_process_group(env: RankEnv, device: str, timeout_s: float) -> None:
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    collective_timeout = datetime.timedelta(minutes=COLLECTIVE_TIMEOUT_MIN)
    if env.world_size == 1:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=collective_timeout)
        return
    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0,
                              timeout=datetime.timedelta(seconds=timeout_s),
                              wait_for_workers=True)
    except Exception as e:  # torch raises several types (DistNetworkError, RuntimeError, ...)
        role = ("serving the rendezvous; not every rank arrived" if env.rank == 0
                else "could not reach rank 0's rendezvous")
        raise RendezvousError(
            f"rank {env.rank} of {env.world_size}: the process group did not form within "
            f"{timeout_s:g}s at {env.endpoint} ({role}: {_first_line(e)}). Check MASTER_ADDR "
            f"(the first node's address, reachable from every node), that MASTER_PORT is free, "
            f"and that all {env.world_size} ranks started (train.init_timeout_s sets the wait)"
        ) from None
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size,
                            timeout=collective_timeout)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def destroy_process_group() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
