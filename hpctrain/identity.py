"""Who this process is in a job: rank, local rank, world size, node and the rendezvous address.

The training ranks and the preflight ranks both read it here. Launchers put ranks in the
environment under different names; the first that applies wins:

1. torchrun (``TORCHELASTIC_RUN_ID`` with ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE``): it
   started this very process;
2. submitit's local executor (``SUBMITIT_LOCAL_GLOBALID`` / ``SUBMITIT_LOCAL_LOCALID`` /
   ``SUBMITIT_LOCAL_NTASKS``): its controller sets them for each task it starts, whatever the
   submitting shell held (the ``local`` profile);
3. a Slurm job step (``SLURM_STEP_ID`` with ``SLURM_PROCID`` / ``SLURM_LOCALID`` /
   ``SLURM_NTASKS``): srun sets them for each task; a ``RANK`` or ``WORLD_SIZE`` inherited
   from the shell that submitted the job must not make every task rank 0 of a world of one;
4. ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` set by another launcher (hpctrain's local
   launcher, the tests' fork server, which clear the variables above);
5. nothing: one process, rank 0 of 1 — except inside a Slurm allocation, where a process
   started without srun (the batch script itself has ``SLURM_PROCID=0`` but no
   ``SLURM_STEP_ID``) is a mistake in the batch script, said as such.

``MASTER_ADDR`` / ``MASTER_PORT`` come from the rendered job script (never guessed from a
hostname, which may not resolve on the nodes). Pure: reads a mapping, never the network.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Mapping

from . import fault_injection
from .errors import HpcTrainError

# (name, rank, local rank, world size, local world size)
TORCHRUN = ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
SUBMITIT_LOCAL = ("submitit-local", "SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_LOCALID",
                  "SUBMITIT_LOCAL_NTASKS", "SUBMITIT_LOCAL_NTASKS")
SLURM = ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE")

# What a launcher that sets torchrun's names clears, so that rule 4 applies to its ranks.
OTHER_LAUNCHERS_VARIABLES = ("TORCHELASTIC_RUN_ID", "SUBMITIT_LOCAL_GLOBALID",
                             "SUBMITIT_LOCAL_LOCALID", "SUBMITIT_LOCAL_NTASKS", "SLURM_STEP_ID",
                             "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                             "SLURM_NTASKS_PER_NODE")


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
    node: str = ""

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


def _int(env: Mapping[str, str], key: str) -> int:
    value = env.get(key, "")
    try:
        return int(value.split("(")[0])  # SLURM_NTASKS_PER_NODE may read "2(x2)"
    except ValueError:
        raise LaunchError(f"environment variable {key}={value!r} is not an integer") from None


def launcher_of(env: Mapping[str, str]) -> tuple[str, str, str, str, str] | None:
    """The launcher whose variables say who this process is (rules 1-4), or None."""
    def has(names) -> bool:
        return bool(env.get(names[1])) and bool(env.get(names[3]))
    if "TORCHELASTIC_RUN_ID" in env and has(TORCHRUN):
        return TORCHRUN
    if has(SUBMITIT_LOCAL):
        return SUBMITIT_LOCAL
    if "SLURM_STEP_ID" in env and has(SLURM):
        return SLURM
    if has(TORCHRUN):
        return TORCHRUN
    return None


def node_name(env: Mapping[str, str] | None = None) -> str:
    """This node's name as Slurm knows it (``SLURMD_NODENAME``), else the host name. Tests
    run several "nodes" on one host with ``HPCTRAIN_TEST_NODE_NAME``."""
    env = os.environ if env is None else env
    return (fault_injection.value("HPCTRAIN_TEST_NODE_NAME", env) or env.get("SLURMD_NODENAME")
            or socket.gethostname())


def rank_env(env: Mapping[str, str] | None = None) -> RankEnv:
    env = os.environ if env is None else env
    found = launcher_of(env)
    if found is not None:
        name, rank_key, local_key, world_key, local_world_key = found
        rank, world = _int(env, rank_key), _int(env, world_key)
        local = _int(env, local_key) if env.get(local_key) else rank
        local_world = _int(env, local_world_key) if env.get(local_world_key) else world
    else:
        if "SLURM_JOB_ID" in env:
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
    try:
        port_number = int(port) if port else 0
    except ValueError:
        raise LaunchError(f"MASTER_PORT={port!r} is not an integer") from None
    return RankEnv(rank=rank, local_rank=local, world_size=world,
                   local_world_size=max(1, min(local_world, world)),
                   master_addr=addr or "127.0.0.1", master_port=port_number,
                   launcher=name, node=node_name(env))


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
RENDEZVOUS_PORTS = (20000, 65535)   # where a rendezvous port is looked for (above Slurm's 6817+)


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections (Linux's default when unreadable)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split()[:2])
        return (low, high) if 0 < low <= high <= 65535 else (32768, 60999)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "", *, ephemeral: tuple[int, int] | None = None,
              tries: int = 200) -> int:
    """A TCP port that is free on this host now (on every interface unless ``host`` says
    which), for a rendezvous that is about to be served here.

    Chosen at random outside the kernel's ephemeral range: a port from ``bind(0)`` is one the
    kernel also gives to outgoing connections, so between this check and the rendezvous
    binding it another process's connection may take it (``EADDRINUSE``; seen with several
    gloo jobs starting at once on one machine). Only where every port is ephemeral does it
    fall back to ``bind(0)``."""
    import random
    low, high = ephemeral or ephemeral_range()
    first, last = RENDEZVOUS_PORTS
    ports = [*range(first, low), *range(high + 1, last + 1)]
    pick = random.SystemRandom()
    for _ in range(tries if ports else 0):
        port = pick.choice(ports)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
