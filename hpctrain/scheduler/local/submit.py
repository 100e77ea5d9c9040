"""Run a job's ranks on this machine through submitit's local executor, under a controller
that outlives the caller."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ...config import ClusterProfile, time_limit_seconds
from ...identity import free_port
from ..interpreters import node_python


def submit_locally(run_dir: Path, submitit_dir: Path, profile: ClusterProfile,
                   function: Callable, args: tuple, env: dict) -> Any:
    """``function(*args)`` in one process per rank on this machine, under a controller that
    outlives the caller; the run's environment as the batch script would set it (the attempt's number and deadline
    are set by the controller at each start of the ranks: :mod:`.controller`)."""
    from .executor import DetachedLocalExecutor
    submitit_dir.mkdir(parents=True, exist_ok=True)
    limit_s = time_limit_seconds(profile) or 24 * 3600
    # the profile's variables first: what hpctrain sets wins (the profile loader refuses those
    # names anyway: config.safety.env_key_problem)
    env = {**{k: str(v) for k, v in profile.env.items()},
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")),
           "HPCTRAIN_RUN_DIR": str(run_dir), "HPCTRAIN_LOG_TO_FILE": "1",
           "HPCTRAIN_PREEMPT_SIGNAL": profile.preemption.signal,
           "SUBMITIT_PREEMPT_SIGNAL": profile.preemption.signal, **env}
    executor = DetachedLocalExecutor(submitit_dir, env, python=node_python(profile))
    executor.update_parameters(tasks_per_node=profile.slurm.gpus_per_node,
                               timeout_min=limit_s / 60,
                               signal_delay_s=profile.preemption.lead_time_s)
    return executor.submit(function, *args)
