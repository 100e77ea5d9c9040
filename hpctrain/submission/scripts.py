"""The batch script of a submission: one builder of its inputs, one render, one place it is
written.

A single job, each job of a chain (the same inputs plus ``--dependency``) and a sweep's job
array (a table of run folders indexed by ``SLURM_ARRAY_TASK_ID``) all get their inputs from
``script_inputs``. ``write_script`` renders and writes the text that ``--dry-run`` leaves for a
person to read and that a real submission hands to sbatch: the same function for both, so
what a dry run shows is what would have been submitted.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ClusterProfile, Resolved, yamlio
from ..record.folder import RunFolder
from ..scheduler.interpreters import node_python, step_python
from ..scheduler.slurm.render import ScriptInputs, render_sbatch, render_step_script


def script_inputs(run: RunFolder, profile: ClusterProfile, *, kind: str = "train",
                  dependency: str | None = None, array_runs: list[RunFolder] | None = None,
                  max_parallel: int | None = None) -> ScriptInputs:
    """The inputs besides the profile and job: ``run``'s folder, the node's and the step's
    Python, submitit's folder. A chain link adds ``dependency``; a job array passes the sweep's
    folder as ``run`` and its runs as ``array_runs`` (at most ``max_parallel`` at once)."""
    return ScriptInputs(run_dir=str(run.path), python=node_python(profile),
                        step_python=step_python(profile), submitit_dir=str(run.submitit_dir),
                        kind=kind, dependency=dependency,
                        array_run_dirs=[str(r.path) for r in array_runs or ()],
                        array_parallelism=max_parallel)


def script_path(run: RunFolder, kind: str = "train") -> Path:
    """``sbatch.sh`` for training (a run's, or a sweep's array), ``KIND.sbatch.sh`` otherwise."""
    return run.script_file if kind == "train" else run.path / f"{kind}.sbatch.sh"


def render_script(inputs: ScriptInputs, *, resolved: Resolved | None = None,
                  profile: ClusterProfile | None = None) -> str:
    """A training job's script (needs ``resolved``) or a step job's (preflight: ``profile``)."""
    if inputs.kind == "train":
        if resolved is None:
            raise ValueError("a training script needs the resolved job")
        return render_sbatch(resolved, inputs)
    if profile is None:
        raise ValueError(f"a {inputs.kind} script needs the profile")
    return render_step_script(profile, inputs)


def write_script(run: RunFolder, inputs: ScriptInputs, *, resolved: Resolved | None = None,
                 profile: ClusterProfile | None = None) -> str:
    """Render the script into ``run``'s folder (replacing the previous submission's) and return
    its text."""
    text = render_script(inputs, resolved=resolved, profile=profile)
    yamlio.write_atomic(script_path(run, inputs.kind), text)
    return text
