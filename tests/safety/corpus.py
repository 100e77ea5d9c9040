"""What the safety tests feed hpctrain and how they read what comes back.

* the shipped files: every cluster profile, every example job and the tests' own jobs;
* walks over the schema (every string field, every leaf of a file as written);
* ``sbatch_reads``: the #SBATCH arguments as Slurm's sbatch reads them from a script (a
  transcription of ``_opt_batch_script``/``_get_argument`` in sbatch's opt.c: lines split at
  ``\\n`` only, the block ends at the first line that is neither blank nor a comment, arguments
  split at whitespace, single and double quotes group, a backslash escapes, an unquoted ``#``
  ends the line, and a line holding "hetjob"/"packjob" starts another job component).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from pathlib import Path

import yaml

from hpctrain.config.job import JobConfig
from hpctrain.config.profile import ClusterProfile
from tests.conftest import REPO

PROFILES = sorted((REPO / "cluster_profiles").glob("*.yaml"))
EXAMPLE_JOBS = sorted((REPO / "examples").glob("*.yaml"))
TEST_JOBS = [REPO / "tests" / "ops" / "tiny-ops.yaml", REPO / "tests" / "resilience" / "drill.yaml"]
JOBS = EXAMPLE_JOBS + [p for p in TEST_JOBS if p.exists()]


def home_profile(job_file: Path) -> tuple[str, dict]:
    """(name, data) of a shipped profile the job's layout fits, a Slurm one first; else the dev
    cluster's profile on one rank (what the operations tests run tiny-ops.yaml on)."""
    from hpctrain.config import job_from_mapping, profile_from_mapping, resolve
    from hpctrain.errors import ConfigError
    job = job_from_mapping(load_yaml(job_file), str(job_file))
    for name in ("dev-slurm", "h100-ib-pyxis", "a100-roce", "local"):
        data = load_yaml(REPO / "cluster_profiles" / f"{name}.yaml")
        try:
            resolve(job, profile_from_mapping(data, name))
        except ConfigError:
            continue
        return name, data
    data = load_yaml(REPO / "cluster_profiles" / "dev-slurm.yaml")
    data["slurm"].update(nodes=1, gpus_per_node=1)
    return "dev-slurm", data


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _unwrap(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def string_fields(cls, prefix: tuple = ()):
    """(path, kind) of every field that holds text: kind is str, list or dict (of str)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _unwrap(hints[f.name])
        path = prefix + (f.name,)
        if dataclasses.is_dataclass(tp):
            yield from string_fields(tp, path)
        elif tp is str:
            yield path, "str"
        elif typing.get_origin(tp) is list and typing.get_args(tp)[0] is str:
            yield path, "list"
        elif typing.get_origin(tp) is dict:
            yield path, "dict"


PROFILE_STRINGS = list(string_fields(ClusterProfile))
JOB_STRINGS = list(string_fields(JobConfig))


def leaves(data, prefix: tuple = ()):
    """Every scalar of a YAML document as written, and every list: (path, value); list items
    have integer path elements."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, prefix + (k,))
    elif isinstance(data, list):
        yield prefix, data
        for i, v in enumerate(data):
            yield from leaves(v, prefix + (i,))
    else:
        yield prefix, data


# What a section created to hold a payload must also have, so that the refusal (or not) is the
# payload's and not a missing required field's: a W&B section needs its project, MLflow its URI.
REQUIRED_IN_NEW_SECTION = {("tracking", "wandb"): {"project": "p"},
                           ("tracking", "mlflow"): {"tracking_uri": "http://localhost:5000"}}


def with_value(data: dict, path: tuple, value) -> dict:
    """A deep copy of ``data`` with ``value`` at ``path`` (missing mappings created, with what
    they require: ``REQUIRED_IN_NEW_SECTION``)."""
    out = copy.deepcopy(data)
    node = out
    for depth, key in enumerate(path[:-1]):
        if isinstance(node, dict) and not isinstance(node.get(key), (dict, list)):
            node[key] = dict(REQUIRED_IN_NEW_SECTION.get(tuple(path[:depth + 1]), {}))
        node = node[key]
    node[path[-1]] = value
    return out


def dotted(path: tuple) -> str:
    """The loader's name for a field path: slurm.exclude[0], env.NCCL_DEBUG."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def payloads(canary: str) -> list[str]:
    """Values that run ``touch canary`` if anything lets them reach a shell unquoted, or that
    end a line of the script (a new command for bash, the end of the #SBATCH block for sbatch)."""
    cmd = f"touch {canary}"
    return [
        f"\n{cmd} #", f"x\n{cmd}", f"x\n{cmd}\n", f"x\r\n{cmd}", f"x\r{cmd}", f"x\0{cmd}",
        f"x'; {cmd}; echo '", f'x"; {cmd}; echo "', f"$({cmd})", f"`{cmd}`",
        f";touch${{IFS}}{canary}", f"x; {cmd}", f"x | {cmd}", f"x && {cmd}", f"x || {cmd}",
        f"x\u2028{cmd}", f"x\u2029{cmd}", f"x\x85{cmd}", f"x\v{cmd}", f"x\f{cmd}", f"x\x1e{cmd}",
        f"x #SBATCH --wrap='{cmd}'", f"x\\\n{cmd}", f"x hetjob {cmd}", f"x\t{cmd}",
        f"x\u202e{cmd}", f"x\\", "x%j%%", "", " ",
    ]


WS = " \t\n\v\f\r"


def _argument(s: str, i: int) -> tuple[str | None, int]:
    n = len(s)
    while i < n and s[i] in WS:
        i += 1
    if i >= n:
        return None, i
    if s[i] == ":":
        raise ValueError(f"sbatch: Unexpected `:` in [{s}]")
    out: list[str] = []
    quoted, q, escape = False, "", False
    while i < n and (quoted or s[i] not in WS) and s[i] != "\n":
        c = s[i]
        if escape:
            escape = False
        elif c == "\\":
            escape = True
            i += 1
            continue
        elif quoted:
            if c == q:
                quoted = False
                i += 1
                continue
        elif c in "\"'":
            quoted, q = True, c
            i += 1
            continue
        elif c == "#":
            break
        out.append(c)
        i += 1
    if quoted:
        raise ValueError(f"sbatch: Unmatched `{q}` in [{s}]")
    return ("".join(out) if out else None), i


def sbatch_reads(script: str) -> list[str]:
    """The arguments sbatch takes from the script's #SBATCH lines, in order; a line that would
    start another heterogeneous-job component adds the marker ``<hetjob>``."""
    args: list[str] = []
    for line in script.split("\n"):
        line = line.split("\0", 1)[0]          # a C string ends at NUL
        if line.startswith("#SBATCH"):
            rest = line[len("#SBATCH"):]
        elif line.startswith("#SLURM"):
            rest = line[len("#SLURM"):]
        else:
            stripped = line.lstrip(WS)
            if stripped and not stripped.startswith("#"):
                break
            continue
        if "hetjob" in line.lower() or "packjob" in line.lower():
            args.append("<hetjob>")
        i = 0
        while True:
            arg, i = _argument(rest, i)
            if arg is None:
                break
            args.append(arg)
    return args
