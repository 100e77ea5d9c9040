"""Who this process is in the allocation: rank, world size, node, rendezvous address.

Slurm's ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS``/``SLURMD_NODENAME`` win over
torchrun-style ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` (under submitit's local executor its
``SUBMITIT_LOCAL_*`` variables do). ``HPCTRAIN_TEST_NODE_NAME`` fakes the node
name so tests can run several "nodes" on one host; ``HPCTRAIN_TEST_PREFLIGHT_DELAY`` makes one
rank (``<rank>:<seconds>``) or node (``<node>:<seconds>``) slow on purpose.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from ..errors import UsageError


@dataclass
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    node: str
    master_addr: str
    master_port: int


def _int(env, *names) -> int | None:
    for n in names:
        v = env.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise UsageError(f"{n}={v!r} is not an integer") from None
    return None


def node_name(env=None) -> str:
    env = os.environ if env is None else env
    return env.get("HPCTRAIN_TEST_NODE_NAME") or env.get("SLURMD_NODENAME") or socket.gethostname()


def rank_info(env=None) -> RankInfo:
    env = os.environ if env is None else env
    if env.get("SUBMITIT_EXECUTOR") == "local":  # submitit's local executor, no Slurm
        rank = _int(env, "SUBMITIT_LOCAL_GLOBALID", "RANK")
        world = _int(env, "SUBMITIT_LOCAL_NTASKS", "WORLD_SIZE")
        local = _int(env, "SUBMITIT_LOCAL_LOCALID", "LOCAL_RANK")
    else:
        rank = _int(env, "SLURM_PROCID", "RANK")
        world = _int(env, "SLURM_NTASKS", "WORLD_SIZE")
        local = _int(env, "SLURM_LOCALID", "LOCAL_RANK")
    if rank is None or world is None:
        raise UsageError("cannot tell this process's rank: set SLURM_PROCID/SLURM_NTASKS (srun) or "
                         "RANK/WORLD_SIZE")
    addr, port = env.get("MASTER_ADDR"), _int(env, "MASTER_PORT")
    if not addr or port is None:
        raise UsageError("MASTER_ADDR and MASTER_PORT must be set (the first node's address and a "
                         "free port) for the collective checks")
    return RankInfo(rank, world, local if local is not None else 0, node_name(env), addr, port)


def injected_delay(info: RankInfo, env=None) -> float:
    """Seconds this rank sleeps before each collective (tests only; 0 normally)."""
    env = os.environ if env is None else env
    spec = env.get("HPCTRAIN_TEST_PREFLIGHT_DELAY", "")
    if not spec:
        return 0.0
    target, _, secs = spec.rpartition(":")
    try:
        seconds = float(secs)
    except ValueError:
        raise UsageError(f"HPCTRAIN_TEST_PREFLIGHT_DELAY={spec!r}: expected <rank|node>:<seconds>") \
            from None
    hit = target == info.node or (target.isdigit() and int(target) == info.rank)
    return seconds if hit else 0.0
