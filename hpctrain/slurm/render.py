"""Render the sbatch script: a pure function of (profile, job, run folder) over a Jinja template.

Safety is layered. Profile and job values were checked against narrow patterns when loaded
(``config/safety.py``); here every value that reaches the script goes through ``q``
(``shlex.quote``) in the template, ``#SBATCH`` values included, and the template environment
uses ``StrictUndefined`` so a missing value is an error, never an empty string. The script
itself contains no logic that needs Python's help to be read: a user can audit it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from .. import __version__, resources
from ..config import ClusterProfile, Resolved
from ..config.profile import time_limit_seconds

TRAIN_TEMPLATE = "train.sbatch.j2"


@dataclass(frozen=True)
class ScriptInputs:
    """Everything besides the profile and job that the script depends on."""

    run_dir: str
    python: str                      # python on the batch host (runs the hooks)
    step_python: str                 # python inside the training step (the container's, if any)
    submitit_dir: str
    kind: str = "train"              # train | preflight
    dependency: str | None = None    # --chain
    extra_excludes: list[str] = field(default_factory=list)
    # --sweep: a job array; task i runs in array_run_dirs[i] (run_dir then holds the sweep's
    # script and batch logs); array_parallelism is the %N limit on tasks running at once
    array_run_dirs: list[str] = field(default_factory=list)
    array_parallelism: int | None = None


def _q(value) -> str:
    return shlex.quote(str(value))


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.templates_dir())),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
        lstrip_blocks=True, autoescape=False)
    env.filters["q"] = _q
    return env


def sbatch_directives(p: ClusterProfile, job_name: str,
                      inputs: ScriptInputs) -> list[tuple[str, str | None]]:
    """``(flag, value)`` pairs for the #SBATCH block, in a stable order (value None: bare flag)."""
    s = p.slurm
    d: list[tuple[str, str | None]] = [("job-name", job_name), ("nodes", str(s.nodes)),
                                        ("ntasks-per-node", str(s.gpus_per_node))]
    if s.gpu_directive == "gpus-per-node":
        d.append(("gpus-per-node", str(s.gpus_per_node)))
    elif s.gpu_directive == "gres":
        d.append(("gres", f"gpu:{s.gpus_per_node}"))
    for key in ("partition", "account", "qos", "reservation"):
        if getattr(s, key):
            d.append((key, getattr(s, key)))
    d.append(("time", s.time_limit))
    if s.cpus_per_task:
        d.append(("cpus-per-task", str(s.cpus_per_task)))
    if s.mem is not None:
        d.append(("mem", s.mem))
    if s.constraint:
        d.append(("constraint", s.constraint))
    if s.exclusive:
        d.append(("exclusive", None))
    excludes = list(s.exclude) + list(inputs.extra_excludes)
    if excludes:
        d.append(("exclude", ",".join(excludes)))
    if inputs.kind == "train":
        d.append(("signal", f"B:{p.preemption.signal}@{p.preemption.lead_time_s}"))
        d.append(("requeue", None))
    else:
        d.append(("no-requeue", None))
    d.append(("open-mode", "append"))
    if inputs.array_run_dirs:
        limit = f"%{inputs.array_parallelism}" if inputs.array_parallelism else ""
        d.append(("array", f"0-{len(inputs.array_run_dirs) - 1}{limit}"))
        d.append(("output", f"{inputs.run_dir}/logs/slurm-%A_%a.log"))
    else:
        d.append(("output", f"{inputs.run_dir}/logs/slurm-%j.log"))
    if inputs.dependency:
        d.append(("dependency", inputs.dependency))
    return d


def render_sbatch(resolved: Resolved, inputs: ScriptInputs) -> str:
    """The training job's batch script. Pure: same inputs, same text (golden-file tests)."""
    return render_script(resolved.profile, inputs, job_name=resolved.job.name,
                         layout=resolved.layout.describe())


def render_step_script(profile: ClusterProfile, inputs: ScriptInputs) -> str:
    """The batch script of a job that trains nothing (``inputs.kind``, e.g. preflight): the
    profile's allocation, environment and container, one task per GPU, no requeue."""
    if inputs.kind == "train":
        raise ValueError("a training script needs the resolved job: use render_sbatch")
    return render_script(profile, inputs, job_name=f"hpctrain-{inputs.kind}",
                         layout=f"{profile.slurm.nodes} node(s) × {profile.slurm.gpus_per_node}")


def render_script(p: ClusterProfile, inputs: ScriptInputs, *, job_name: str, layout: str) -> str:
    directives = [f"#SBATCH --{k}" if v is None else f"#SBATCH --{k}={_q(v)}"
                  for k, v in sbatch_directives(p, job_name, inputs)]
    directives += [f"#SBATCH {x}" for x in p.slurm.extra_directives]
    container = []
    if p.container.image:
        container.append(f"--container-image={p.container.image}")
        mounts = list(p.container.mounts)
        for d in [inputs.run_dir] + list(inputs.array_run_dirs):
            if d not in [m.split(":")[0] for m in mounts]:
                mounts.append(f"{d}:{d}")
        container.append(f"--container-mounts={','.join(mounts)}")
        if p.container.workdir:
            container.append(f"--container-workdir={p.container.workdir}")
    env = dict(p.env)
    env.setdefault("HPCTRAIN_PREEMPT_SIGNAL", p.preemption.signal)
    context = {
        "version": __version__,
        "kind": inputs.kind,
        "run_dir": inputs.run_dir,
        "run_id": Path(inputs.run_dir).name,
        "job_name": job_name,
        "profile_name": p.name,
        "layout": layout,
        "directives": directives,
        "modules": list(p.modules),
        "env": env,
        "python": inputs.python,
        "step_python": inputs.step_python,
        "submitit_dir": inputs.submitit_dir,
        "container_args": container,
        "signal": p.preemption.signal,
        "lead_time_s": p.preemption.lead_time_s,
        "time_limit_s": time_limit_seconds(p),
        "gate": inputs.kind == "train" and p.preflight.gate,
        "gpus_per_node": p.slurm.gpus_per_node,
        "nodes": p.slurm.nodes,
        "array_run_dirs": list(inputs.array_run_dirs),
    }
    return _env().get_template(TRAIN_TEMPLATE).render(**context)
