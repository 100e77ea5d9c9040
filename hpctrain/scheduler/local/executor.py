"""submitit's local executor, with the task controller started in its own session: a Ctrl-C
on ``hpctrain submit --wait`` must not kill the training, exactly as it would not kill a Slurm
job; and the rendezvous/run environment the ranks expect. The controller is submitit's, with
each start of the ranks made an attempt of the run (:mod:`.controller`)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import submitit
from submitit.local import local as _local

from .jobs import CONTROLLER_MODULE


class DetachedLocalExecutor(submitit.LocalExecutor):
    """Local executor whose controller survives the submitting process and its Ctrl-C."""

    def __init__(self, folder: Path, env: dict[str, str], python: str | None = None) -> None:
        super().__init__(folder, python=None if python is None else shlex.quote(python))
        self._extra_env = dict(env)

    def _submit_command(self, command: str):
        ntasks = self.parameters.get("tasks_per_node", 1)
        env = dict(os.environ)
        env.update(self._extra_env)
        env.update(
            SUBMITIT_LOCAL_NTASKS=str(ntasks),
            SUBMITIT_LOCAL_COMMAND=command,
            SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * self.parameters.get("timeout_min", 60))),
            SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(int(self.parameters.get("signal_delay_s", 30))),
            SUBMITIT_LOCAL_NODEID="0",
            SUBMITIT_LOCAL_JOB_NUM_NODES="1",
            SUBMITIT_STDERR_TO_STDOUT="1",
            SUBMITIT_EXECUTOR="local",
            SUBMITIT_LOCAL_WITH_SHELL="",
        )
        # CUDA_VISIBLE_DEVICES is left as the machine has it: submitit's own executor sets it
        # from gpus_per_node (0, or unset: "", every GPU hidden), but each rank picks its GPU
        # by local rank (torch.cuda.set_device), as under Slurm
        log = open(Path(self.folder) / "controller.log", "ab")
        process = subprocess.Popen([sys.executable, "-m", CONTROLLER_MODULE, str(self.folder)],
                                   env=env, start_new_session=True, stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL)
        log.close()
        return _local.LocalJob(folder=self.folder, job_id=str(process.pid), process=process,
                               tasks=list(range(ntasks)))
