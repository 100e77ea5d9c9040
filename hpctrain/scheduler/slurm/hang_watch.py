"""The batch shell's hang watcher: ``python -m hpctrain.scheduler.slurm.batch_steps watch``.

Started by the batch script beside the training step (``srun``), on the first node, outside any
container. Every ``POLL_S`` seconds it reads the ranks' heartbeat files
(``hpctrain.health.heartbeat``) and asks ``hpctrain.health.hang.HangMonitor`` whether the job is
hung. When it is:

1. the verdict goes to ``logs/attempt-N/hang.json`` (``claim_verdict``: a rank's own watchdog
   may have decided first; then that verdict stands) and an event, and the batch log says it;
2. every rank of the step gets SIGQUIT (``scancel --signal QUIT``: the job's steps, not this
   shell): ``faulthandler`` writes its Python stacks to ``stacks-rank-R.txt``, even in a rank
   stuck in C code; then SIGCONT, so a stopped rank dumps and runs again;
3. the ranks see the verdict and exit with ``exit_codes.HUNG`` (their peers are stuck in a
   collective and would never return); whatever still runs after ``EXIT_WAIT_S`` is killed
   (``scancel --signal KILL JOBID.STEP``).

The ``end`` step then records the attempt as ``hung``, names the rank and node, and requeues
without that node (``batch_steps.requeue_excluding``, as the preflight gate does).
"""

from __future__ import annotations

import os
import sys
import time

from ...health import hang as hangs
from ...health.heartbeat import read_beats
from ...record.folder import RunFolder
from . import commands

POLL_S = 2.0
EXIT_WAIT_S = 30.0
BEAT_S = 5.0        # runtime.watchdog.BEAT_S (not imported: that module is the ranks')


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(run: RunFolder, attempt: int, job_id: str, srun_pid: int, *, poll_s: float = POLL_S,
          exit_wait_s: float = EXIT_WAIT_S, clock=time.monotonic, sleep=time.sleep,
          is_alive=alive, signal_steps=None, kill_steps=None) -> hangs.Verdict | None:
    """Watch until the step ends; on a hang act as the module says. Returns the verdict, or
    None when the step ended without one."""
    signal_steps = signal_steps or (lambda sig: commands.cancel([job_id], signal=sig))
    kill_steps = kill_steps or (lambda: commands.cancel(commands.job_steps(job_id),
                                                         signal="KILL"))
    folder = run.attempt_dir(attempt)
    monitor = hangs.HangMonitor(BEAT_S)
    verdict = None
    while is_alive(srun_pid):
        sleep(poll_s)
        monitor.update(read_beats(folder), clock())
        verdict = hangs.read_verdict(folder) or monitor.check(clock(), decided_by="batch shell")
        if verdict is not None:
            break
    if verdict is None:
        return None
    dump = run.resolved_job().health.dump_stacks
    if not verdict.stacks and dump:
        verdict.stacks = f"logs/attempt-{attempt}/{hangs.STACKS_PATTERN}"
    verdict = hangs.claim_verdict(folder, verdict)
    print(f"[hpctrain] {time.strftime('%T')} hang: {verdict.message} (decided by "
          f"{verdict.decided_by})", file=sys.stderr, flush=True)
    run.event("hang", attempt=attempt, rank=verdict.rank, node=verdict.node, step=verdict.step,
              idle_s=verdict.idle_s, limit_s=verdict.limit_s, message=verdict.message)
    for sig in (("QUIT",) if dump else ()) + ("CONT",):
        try:
            signal_steps(sig)
        except Exception as e:  # noqa: BLE001 - the kill below still ends the attempt
            print(f"[hpctrain] scancel --signal {sig} failed: {e}", file=sys.stderr, flush=True)
    deadline = clock() + exit_wait_s
    while is_alive(srun_pid) and clock() < deadline:
        sleep(0.5)
    if is_alive(srun_pid):
        print(f"[hpctrain] ranks still running {exit_wait_s:.0f} s after the hang verdict; "
              f"killing the step", file=sys.stderr, flush=True)
        try:
            kill_steps()
        except Exception as e:  # noqa: BLE001
            print(f"[hpctrain] killing the step failed: {e}", file=sys.stderr, flush=True)
    return verdict
