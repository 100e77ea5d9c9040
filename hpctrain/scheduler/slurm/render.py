"""Render the sbatch script: a pure function of (profile, job, run folder) over a Jinja template.

Safety is layered. Profile and job values were checked against narrow patterns when loaded
(``config/safety.py``). Here, at the one door every value passes on its way into the script,
``check_script_values`` refuses any value, whatever its source (profile, job, command-line
paths, the interpreter's own path), that holds a character ending a line for bash or sbatch,
and any ``#SBATCH`` value that would split the job; then every value is quoted for whoever
reads it: ``q`` (``shlex.quote``) for bash, ``safety.sbatch_quote`` for sbatch's ``#SBATCH``
parser (which is not a shell). The template environment uses ``StrictUndefined`` so a missing
value is an error, never an empty string. The script itself contains no logic that needs
Python's help to be read: a user can audit it.
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from ... import __version__, resources
from ...config import ClusterProfile, Resolved, safety
from ...config.profile import SIGNALS, time_limit_seconds
from ...errors import UsageError

TRAIN_TEMPLATE = "train.sbatch.j2"


@dataclass(frozen=True)
class ScriptInputs:
    """Everything besides the profile and job that the script depends on."""

    run_dir: str
    python: str                      # python on the batch host (runs the batch steps)
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


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    """One environment per process: it caches the compiled template (reloaded if it changes)."""
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
    spares = p.resilience.spare_nodes if inputs.kind == "train" else 0
    d: list[tuple[str, str | None]] = [("job-name", job_name), ("nodes", str(s.nodes + spares)),
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
    if s.mem:   # "0" (all of a node's memory) is a value; "" is none
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
        if spares:
            # a failing node leaves the allocation instead of ending it: the batch shell
            # restarts the training step on a spare (see in_job_restart)
            d.append(("no-kill", None))
    else:
        d.append(("no-requeue", None))
    d.append(("open-mode", "append"))
    # Slurm expands %x, %j, ... in file names: a % of the folder's own is written %%
    logs = inputs.run_dir.replace("%", "%%") + "/logs"
    if inputs.array_run_dirs:
        limit = f"%{inputs.array_parallelism}" if inputs.array_parallelism else ""
        d.append(("array", f"0-{len(inputs.array_run_dirs) - 1}{limit}"))
        d.append(("output", f"{logs}/slurm-%A_%a.log"))
    else:
        d.append(("output", f"{logs}/slurm-%j.log"))
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


def check_script_values(p: ClusterProfile, inputs: ScriptInputs, job_name: str, layout: str,
                        directives: list[tuple[str, str | None]]) -> None:
    """The door: refuse, with what it is and the fix, any value that could end a line of the
    script (a new command for bash; for sbatch, the end of the #SBATCH block) or split the job
    into heterogeneous components. Profiles and jobs were checked when loaded; this also covers
    what they did not: run folders from the command line or the environment, the interpreter."""
    named: list[tuple[str, object]] = [
        ("the run folder", inputs.run_dir), ("the batch host's python", inputs.python),
        ("the training step's python", inputs.step_python),
        ("the submitit folder", inputs.submitit_dir), ("the job name", job_name),
        ("the profile name", p.name), ("the layout", layout), ("--chain's dependency",
                                                              inputs.dependency or "")]
    named += [(f"the run folder of array task {i}", d) for i, d in enumerate(inputs.array_run_dirs)]
    named += [("an excluded node", x) for x in inputs.extra_excludes]
    named += [(f"modules[{i}]", m) for i, m in enumerate(p.modules)]
    named += [(f"env.{k}", v) for k, v in p.env.items()]
    named += [("a container setting", a) for a in container_args(p, inputs)]
    named += [(f"#SBATCH --{k}", v) for k, v in directives if v is not None]
    named += [(f"slurm.extra_directives[{i}]", x) for i, x in enumerate(p.slurm.extra_directives)]
    for what, value in named:
        if not isinstance(value, str):
            raise UsageError(f"cannot write the batch script: {what} is not text ({value!r})")
        why = safety.script_problem(value)
        if why:
            raise UsageError(f"cannot write the batch script: {what} {safety.short(value, 200)} {why}; "
                             "a line break there would end the line in the script (choose a "
                             "value without one)")
    # values where a command reads a word: srun's program, module's name, pyxis's options
    words = [("python", inputs.python), ("python", inputs.step_python)]
    words += [("module name", m) for m in p.modules]
    words += [(f"{a.partition('=')[0]} value", a.partition("=")[2])
              for a in container_args(p, inputs)]
    for what, value in words:
        why = safety.option_problem(value, what)
        if why:
            raise UsageError(f"cannot write the batch script: {why}")
    for node in inputs.extra_excludes:
        if not safety.NODE_LIST.fullmatch(node):
            raise UsageError(f"cannot write the batch script: {safety.short(node)} is not a node "
                             "name to exclude")
    if inputs.dependency and not safety.DEPENDENCY.fullmatch(inputs.dependency):
        raise UsageError(f"cannot write the batch script: {safety.short(inputs.dependency)} is "
                         "not a Slurm dependency (e.g. afterany:123)")
    for key in p.env:
        why = safety.env_key_problem(key)
        if why:
            raise UsageError(f"cannot write the batch script: env: {why}")
    for what, value in named:
        if what.startswith(("#SBATCH", "slurm.extra")) and safety.het_job_word(value):
            raise UsageError(f"cannot write the batch script: {what} {safety.short(value, 200)} contains "
                             f"{safety.het_job_word(value)!r}, which sbatch reads as the start of "
                             "another heterogeneous-job component; choose another name or folder")
    if "\\" in inputs.run_dir:
        raise UsageError(f"cannot write the batch script: the run folder {safety.short(inputs.run_dir)} "
                         "holds a backslash, which turns off Slurm's %j in log file names; choose a "
                         "folder without one")
    if p.container.image:
        for d in [inputs.run_dir] + list(inputs.array_run_dirs):
            if "," in d or ":" in d:
                raise UsageError(f"cannot write the batch script: the run folder {safety.short(d)} "
                                 "holds ',' or ':', which pyxis's --container-mounts cannot express; "
                                 "choose a runs folder without them")
    if not safety.SCRIPT_WORD.fullmatch(inputs.kind) or p.preemption.signal not in SIGNALS:
        raise UsageError(f"cannot write the batch script: unknown kind {inputs.kind!r} or signal "
                         f"{p.preemption.signal!r}")
    for what, number in (("slurm.nodes", p.slurm.nodes), ("slurm.gpus_per_node", p.slurm.gpus_per_node),
                         ("resilience.spare_nodes", p.resilience.spare_nodes),
                         ("preemption.lead_time_s", p.preemption.lead_time_s)):
        if not isinstance(number, int) or isinstance(number, bool):
            raise UsageError(f"cannot write the batch script: {what} is not an integer ({number!r})")


def container_args(p: ClusterProfile, inputs: ScriptInputs) -> list[str]:
    """srun's pyxis options: the image, the mounts (the run folders always among them), workdir."""
    if not p.container.image:
        return []
    args = [f"--container-image={p.container.image}"]
    mounts = list(p.container.mounts)
    for d in [inputs.run_dir] + list(inputs.array_run_dirs):
        if d not in [m.split(":")[0] for m in mounts]:
            mounts.append(f"{d}:{d}")
    args.append(f"--container-mounts={','.join(mounts)}")
    if p.container.workdir:
        args.append(f"--container-workdir={p.container.workdir}")
    return args


def srun_cpu_args(p: ClusterProfile) -> list[str]:
    """srun's CPU options for every step. Since Slurm 22.05 a step no longer inherits
    ``--cpus-per-task`` from sbatch, so it is passed again; each task is bound to its own cores,
    handed out in blocks so that a rank's cores (its DataLoader workers included) sit together
    in one socket, near its GPU on the usual two-socket GPU nodes."""
    if not p.slurm.cpus_per_task:
        return []
    return [f"--cpus-per-task={int(p.slurm.cpus_per_task)}", "--cpu-bind=cores",
            "--distribution=block:block"]


def render_script(p: ClusterProfile, inputs: ScriptInputs, *, job_name: str, layout: str) -> str:
    pairs = sbatch_directives(p, job_name, inputs)
    check_script_values(p, inputs, job_name, layout, pairs)
    directives = [f"#SBATCH --{k}" if v is None else f"#SBATCH --{k}={safety.sbatch_quote(v)}"
                  for k, v in pairs]
    directives += [f"#SBATCH {x}" for x in p.slurm.extra_directives]
    container = container_args(p, inputs)
    env = dict(p.env)
    env.setdefault("HPCTRAIN_PREEMPT_SIGNAL", p.preemption.signal)
    if p.interconnect.socket_ifname:
        # gloo (megatron-core's CPU-side groups) picks its interface like NCCL's bootstrap
        env.setdefault("GLOO_SOCKET_IFNAME", p.interconnect.socket_ifname)
    for key, value in env.items():   # the profile's and hpctrain's own, as the template exports them
        why = safety.script_problem(str(value)) or (
            None if safety.ENV_KEY.fullmatch(key) else "is not a variable name")
        if why:
            raise UsageError(f"cannot write the batch script: env.{key} {why}")
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
        "srun_args": srun_cpu_args(p),
        "signal": p.preemption.signal,
        "lead_time_s": p.preemption.lead_time_s,
        "time_limit_s": time_limit_seconds(p),
        "gate": inputs.kind == "train" and p.preflight.gate,
        "gpus_per_node": p.slurm.gpus_per_node,
        "nodes": p.slurm.nodes,
        "spare_nodes": p.resilience.spare_nodes if inputs.kind == "train" else 0,
        "array_run_dirs": list(inputs.array_run_dirs),
    }
    return _env().get_template(TRAIN_TEMPLATE).render(**context)
