"""Who this process is in the job: rank, local rank, world size and the rendezvous address.

Three launchers put ranks in the environment under different names; the first complete set
wins, in this order:

* ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE``: torchrun and the test launcher (explicit beats
  inherited, so a test started inside an allocation is not mistaken for a Slurm task);
* ``SUBMITIT_LOCAL_GLOBALID`` / ``SUBMITIT_LOCAL_LOCALID`` / ``SUBMITIT_LOCAL_NTASKS``:
  submitit's local executor (the ``local`` profile);
* ``SLURM_PROCID`` / ``SLURM_LOCALID`` / ``SLURM_NTASKS``: one srun task per GPU.

``MASTER_ADDR`` / ``MASTER_PORT`` come from the rendered script (never guessed from a
hostname, which may not resolve on the nodes). Pure: reads a mapping, never the network.
Also the ``HPCTRAIN_*`` variables the submit side passes to every rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..errors import HpcTrainError

LAUNCHERS = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    ("submitit-local", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_NTASKS",
     "SUBMITIT_LOCAL_NTASKS"),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"),
)


class LaunchError(HpcTrainError):
    """The environment does not say who this rank is or where to meet the others."""


@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


def _int(env: Mapping[str, str], key: str) -> int:
    value = env.get(key, "")
    try:
        return int(value.split("(")[0])  # SLURM_NTASKS_PER_NODE may read "2(x2)"
    except ValueError:
        raise LaunchError(f"environment variable {key}={value!r} is not an integer") from None


def launchers(env: Mapping[str, str]):
    """The launchers in the order to trust them. Inside a Slurm job step (``SLURM_STEP_ID``)
    Slurm's own variables win unless torchrun really started this process (it always sets
    ``TORCHELASTIC_RUN_ID``): a ``RANK``/``WORLD_SIZE`` inherited from the shell that submitted
    the job must not turn every task into rank 0 of a world of one."""
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env and "TORCHELASTIC_RUN_ID" not in env:
        return (LAUNCHERS[2],) + LAUNCHERS[:2]
    return LAUNCHERS


def rank_env(env: Mapping[str, str] | None = None) -> RankEnv:
    env = os.environ if env is None else env
    for name, rank_key, local_key, world_key, local_world_key in launchers(env):
        if rank_key in env and world_key in env:
            rank, world = _int(env, rank_key), _int(env, world_key)
            local = _int(env, local_key) if local_key in env else rank
            local_world = _int(env, local_world_key) if env.get(local_world_key) else world
            break
    else:
        if "SLURM_JOB_ID" in env and "SLURM_PROCID" not in env:
            raise LaunchError("running in a Slurm allocation but not in a job step: start the "
                              "ranks with srun (one task per GPU), not directly in the batch script")
        rank, world, local, local_world, name = 0, 1, 0, 1, "single"
    if not 0 <= rank < world:
        raise LaunchError(f"rank {rank} is outside the world size {world} ({name} environment)")
    addr = env.get("MASTER_ADDR")
    port = env.get("MASTER_PORT")
    if world > 1 and not (addr and port):
        missing = " and ".join(k for k in ("MASTER_ADDR", "MASTER_PORT") if not env.get(k))
        raise LaunchError(f"{missing} not set: {world} ranks need the rendezvous address "
                          f"(the rendered job script exports the first node's address and a port)")
    return RankEnv(rank=rank, local_rank=local, world_size=world,
                   local_world_size=max(1, min(local_world, world)),
                   master_addr=addr or "127.0.0.1", master_port=int(port) if port else 0,
                   launcher=name)


@dataclass(frozen=True)
class JobEnv:
    """What the submit side tells every rank (``HPCTRAIN_*``)."""

    run_dir: str | None
    attempt: int | None
    deadline: float | None
    preempt_signal: str | None
    signal_flag: str | None
    log_to_file: bool
    local_executor: bool
    local_job_id: str | None


def job_env(env: Mapping[str, str] | None = None) -> JobEnv:
    env = os.environ if env is None else env
    attempt = env.get("HPCTRAIN_ATTEMPT")
    deadline = env.get("HPCTRAIN_DEADLINE")
    try:
        attempt_n = int(attempt) if attempt else None
        deadline_t = float(deadline) if deadline else None
    except ValueError:
        raise LaunchError(f"HPCTRAIN_ATTEMPT={attempt!r} / HPCTRAIN_DEADLINE={deadline!r}: expected "
                          f"an integer and epoch seconds") from None
    return JobEnv(run_dir=env.get("HPCTRAIN_RUN_DIR") or None, attempt=attempt_n,
                  deadline=deadline_t, preempt_signal=env.get("HPCTRAIN_PREEMPT_SIGNAL") or None,
                  signal_flag=env.get("HPCTRAIN_SIGNAL_FLAG") or None,
                  log_to_file=env.get("HPCTRAIN_LOG_TO_FILE") == "1",
                  local_executor=env.get("SUBMITIT_EXECUTOR") == "local",
                  local_job_id=env.get("SUBMITIT_LOCAL_JOB_ID") or None)
