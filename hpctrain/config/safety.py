"""What a value may look like before it goes anywhere near a generated shell script.

Two layers protect the rendered sbatch script: values are checked here against tight
patterns when a profile or job is loaded (so the user hears about ``partition: "gpu; rm -rf ~"``
before anything is written), and the template shell-quotes every value it prints anyway.
Patterns are deliberately narrow: the characters Slurm, environment modules and pyxis actually
use, nothing that a shell gives meaning to.
"""

from __future__ import annotations

import re

from .schema import Problems

SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
JOB_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")
NODE_LIST = re.compile(r"^[A-Za-z0-9_.,\[\]-]+$")
CONSTRAINT = re.compile(r"^[A-Za-z0-9_.&|\[\]*(),:!-]+$")
MEMORY = re.compile(r"^\d+[KMGT]?$")
# D-HH:MM:SS, D-HH:MM, D-HH, HH:MM:SS, MM:SS, MM
TIME_LIMIT = re.compile(r"^(\d+-\d{1,2}(:\d{2}(:\d{2})?)?|\d{1,2}:\d{2}:\d{2}|\d+:\d{2}|\d+)$")
MODULE = re.compile(r"^[A-Za-z0-9_.+/@-]+$")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE = re.compile(r"^[A-Za-z0-9_./:@#+-]+$")
MOUNT = re.compile(r"^[A-Za-z0-9_./+-]+(:[A-Za-z0-9_./+-]+)?(:[a-z,]+)?$")
PATH_LIKE = re.compile(r"^[A-Za-z0-9_./~+@%:=-][A-Za-z0-9_./~+@%:= -]*$")
DIRECTIVE = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:=@%/+*\[\]-]+)?$")
HCA = re.compile(r"^[A-Za-z0-9_]+(:\d+)?$")
IFNAME = re.compile(r"^[\^=]?[A-Za-z0-9_.,-]+$")

# Directives the rendered script sets itself; a raw directive must not fight them.
OWNED_DIRECTIVES = {
    "job-name": "set the job's `name` instead",
    "nodes": "set slurm.nodes (or pass --nodes) instead",
    "ntasks": "set slurm.gpus_per_node instead (one task per GPU)",
    "ntasks-per-node": "set slurm.gpus_per_node instead (one task per GPU)",
    "gpus-per-node": "set slurm.gpus_per_node instead",
    "gres": "set slurm.gpu_directive and slurm.gpus_per_node instead",
    "partition": "set slurm.partition instead",
    "account": "set slurm.account instead",
    "qos": "set slurm.qos instead",
    "reservation": "set slurm.reservation instead",
    "time": "set slurm.time_limit instead",
    "cpus-per-task": "set slurm.cpus_per_task instead",
    "mem": "set slurm.mem instead",
    "constraint": "set slurm.constraint instead",
    "exclusive": "set slurm.exclusive instead",
    "exclude": "set slurm.exclude instead",
    "signal": "set preemption.signal and preemption.lead_time_s instead",
    "requeue": "remove it (jobs are always requeueable; see preemption.max_requeues)",
    "no-requeue": "set preemption.max_requeues: 0 instead",
    "output": "remove it (logs go to the run folder)",
    "error": "remove it (logs go to the run folder)",
    "open-mode": "remove it (logs go to the run folder)",
    "chdir": "remove it (the job runs in its run folder)",
    "wrap": "remove it (hpctrain writes the script)",
    "array": "use `hpctrain submit --sweep` instead",
    "dependency": "use `hpctrain submit --chain` instead",
    "export": "use the profile's `env` mapping instead",
    "test-only": "use `hpctrain submit --dry-run` instead",
    "parsable": "remove it",
}


def check(pattern: re.Pattern, value, path: str, problems: Problems, what: str) -> None:
    """Add a problem when a (non-empty) string value does not match ``pattern``."""
    if value is None or value == "":
        return
    if not isinstance(value, str) or not pattern.match(value):
        problems.add(path, f"{value!r} is not a valid {what}")


def check_directive(value: str, path: str, problems: Problems) -> None:
    if not isinstance(value, str):
        return
    if not DIRECTIVE.match(value):
        problems.add(path, f"{value!r} is not a valid sbatch directive; write it as --name or "
                           "--name=value (letters, digits and _.,:=@%/+*[]- only, no spaces or quotes)")
        return
    name = value[2:].split("=", 1)[0]
    if name in OWNED_DIRECTIVES:
        problems.add(path, f"--{name} is managed by hpctrain: {OWNED_DIRECTIVES[name]}")


def check_env_value(key: str, value, path: str, problems: Problems) -> None:
    if not ENV_KEY.match(key):
        problems.add(path, f"{key!r} is not a valid environment variable name "
                           "(letters, digits and _, not starting with a digit)")
    if isinstance(value, str) and any(c in value for c in "\n\r\0"):
        problems.add(path, "environment values must be on one line")
