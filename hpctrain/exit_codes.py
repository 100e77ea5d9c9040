"""Exit codes shared by the training ranks, the batch shell and the CLI.

The batch shell decides whether to requeue from the training step's exit code, so these are
a contract: change them only together with ``sbatch_templates/train.sbatch.j2``.
"""

FINISHED = 0          # training reached train.steps
FAILED = 1            # a crash; requeued only when preemption.requeue_on_failure is set
USAGE = 2             # bad input (CLI)
UNSTABLE = 3          # the loss-spike/NaN guard stopped the run: a human must look
PREFLIGHT_FAILED = 4  # preflight gate found bad nodes (they are excluded on requeue)
PREEMPTED = 75        # signal or deadline: an emergency checkpoint was saved; requeue me
LOCAL_REQUEUE = 144   # submitit's local executor restarts the tasks on this code

REASONS = {
    FINISHED: "finished",
    FAILED: "failed",
    UNSTABLE: "unstable",
    PREFLIGHT_FAILED: "preflight_failed",
    PREEMPTED: "preempted",
    LOCAL_REQUEUE: "preempted",
}


def reason_for(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code > 128 or code < 0:
        return "killed"
    return REASONS.get(code, "failed")
