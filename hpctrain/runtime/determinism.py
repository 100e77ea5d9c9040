"""``train.deterministic_mode``: bitwise-reproducible training, as Megatron-LM's
``--deterministic-mode`` sets it up (``megatron/training/arguments.py``, core_v0.16.1).

What it turns on, and why each is needed for two runs of one job to give the same bits:

* ``torch.use_deterministic_algorithms(True)`` (strict, not warn-only): torch then runs the
  deterministic backward of FlashAttention-2 and of the memory-efficient attention (without
  it both accumulate dQ with atomics), and refuses an op without a deterministic version
  instead of running it;
* ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS reproducibility; read when cuBLAS starts, so set
  before CUDA is used; a value already in the environment is kept);
* ``NCCL_ALGO=Ring`` unless set (Megatron-LM requires NCCL_ALGO to name one algorithm, so that
  a reduction's order does not change with NCCL's tuning);
* megatron-core's ``deterministic_mode`` (its embedding avoids the atomics of
  ``F.embedding``'s backward), no cuDNN attention (torch has no deterministic backward for it:
  ``fused_attention.kernel_order``), no cross-entropy fusion (Megatron-LM refuses it).

Without it a GPU run is still resumed exactly (the checkpoint holds the state bit for bit, the
data order and RNG streams continue), but kernels that accumulate with atomics (fused
attention's backward) make two runs differ in the last bits from the first step on, resumed
or not.
"""

from __future__ import annotations

import os

CUBLAS = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
NCCL_ALGO = ("NCCL_ALGO", "Ring")


def prepare_environment(job, environ=None) -> list[str]:
    """Before CUDA and NCCL start: the environment deterministic mode needs. Returns notes."""
    if not getattr(job.train, "deterministic_mode", False):
        return []
    environ = os.environ if environ is None else environ
    notes = []
    for name, value in (CUBLAS, NCCL_ALGO):
        kept = environ.setdefault(name, value)
        if kept != value:
            notes.append(f"deterministic mode: {name}={kept} from the environment is kept")
    return notes


def enable(job) -> bool:
    """After torch is imported, before the model is built."""
    if not getattr(job.train, "deterministic_mode", False):
        return False
    import torch
    torch.use_deterministic_algorithms(True)
    return True
