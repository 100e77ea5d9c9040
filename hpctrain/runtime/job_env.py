"""What the submit side tells every rank of a job: the ``HPCTRAIN_*`` variables (run folder,
attempt, deadline, signal) and whether submitit's local executor runs it. Who the rank is
comes from :mod:`hpctrain.identity`. Pure: reads a mapping.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..identity import LaunchError


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
