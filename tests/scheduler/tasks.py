"""Small task functions submitted through hpctrain in tests (pickled by value: the job need not
import the tests package)."""

from __future__ import annotations

import os
import socket

import cloudpickle

KEYS = ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURMD_NODENAME", "MASTER_ADDR",
        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "HPCTRAIN_ATTEMPT", "HPCTRAIN_DEADLINE",
        "HPCTRAIN_RUN_DIR", "HPCTRAIN_SIGNAL_FLAG", "NCCL_DEBUG", "OMP_NUM_THREADS", "RANK",
        "WORLD_SIZE"]


def task_environment() -> dict:
    env = {k: os.environ.get(k) for k in KEYS}
    # the rendezvous address must be reachable from every task
    with socket.create_connection((env["MASTER_ADDR"], int(os.environ["TEST_ECHO_PORT"])), 5):
        env["reached_master"] = True
    return env


def fail_on_rank(rank: int) -> str:
    if int(os.environ.get("SLURM_PROCID", "0")) == rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    return "ok"


cloudpickle.register_pickle_by_value(__import__(__name__))


def cuda_visible_devices() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")
