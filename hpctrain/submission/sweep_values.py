"""Sweeps: ``--sweep train.lr=1e-4,3e-4 --sweep batch.global_batch_size=16,32`` -> one run per
combination (the cartesian product), every one validated like a job file before anything is
submitted.

Values are YAML scalars (``1e-4``, ``true``, ``null``, ``cosine``) checked by the job schema, so
a sweep value gets exactly the error the same value would get in the job file; a value that
breaks the parallel layout on the chosen profile is refused, naming the combination. A relative
path given as a value (``checkpoint.dir``, ``data.path``, ``train.init_from``) is relative to
the job file's folder, as in the job file.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..config import ClusterProfile, Resolved, job_from_mapping, load_job, resolve
from ..config.loader import resolve_job_paths
from ..config.schema import to_dict
from ..errors import ConfigError, UsageError
from ..record.folder import new_private_folder

KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
SWEEP_DIR = "sweeps"


@dataclass(frozen=True)
class SweepAxis:
    key: str            # dotted path in the job file, e.g. train.lr
    values: tuple       # parsed YAML scalars, in the order given


@dataclass
class SweepPoint:
    index: int
    values: dict        # key -> value of this combination
    resolved: Resolved

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values.items())


def parse_axis(spec: str) -> SweepAxis:
    """``train.lr=1e-4,3e-4`` -> SweepAxis('train.lr', (0.0001, 0.0003))."""
    key, sep, rest = spec.partition("=")
    key = key.strip()
    if not sep or not rest.strip():
        raise UsageError(f"--sweep {spec!r}: expected KEY=V1,V2,... (e.g. --sweep train.lr=1e-4,3e-4)")
    if not KEY_RE.match(key):
        raise UsageError(f"--sweep {spec!r}: {key!r} is not a dotted job-file key "
                         "(e.g. train.lr, batch.global_batch_size)")
    values = []
    for raw in rest.split(","):
        raw = raw.strip()
        if not raw:
            raise UsageError(f"--sweep {spec!r}: empty value in the list")
        try:
            v = yaml.safe_load(raw)
        except yaml.YAMLError:
            v = raw
        if isinstance(v, (dict, list)):
            raise UsageError(f"--sweep {spec!r}: {raw!r} is not a single value")
        values.append(v)
    if len(set(map(repr, values))) != len(values):
        raise UsageError(f"--sweep {spec!r}: a value is listed twice")
    return SweepAxis(key, tuple(values))


def parse_axes(specs: list[str]) -> list[SweepAxis]:
    axes = [parse_axis(s) for s in specs]
    seen = set()
    for a in axes:
        if a.key in seen:
            raise UsageError(f"--sweep: {a.key} is given twice; list all its values in one --sweep")
        seen.add(a.key)
    return axes


def combinations(axes: list[SweepAxis]) -> list[dict]:
    """Cartesian product, the first axis varying slowest (like nested loops in given order)."""
    keys = [a.key for a in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(a.values for a in axes))]


def set_path(data: dict, key: str, value) -> None:
    parts = key.split(".")
    node = data
    for i, p in enumerate(parts[:-1]):
        child = node.get(p)
        if not isinstance(child, dict):
            where = ".".join(parts[:i + 1])
            raise UsageError(f"--sweep {key}: {where} is not a section of the job file")
        node = child
    node[parts[-1]] = value


def get_path(data: dict, key: str):
    for part in key.split("."):
        data = data[part]
    return data


def expand(job_file: str, profile: ClusterProfile, specs: list[str]) -> list[SweepPoint]:
    """Every combination as a resolved job on ``profile``; all problems raised at once."""
    axes = parse_axes(specs)
    base = to_dict(load_job(job_file))
    job_folder = Path(job_file).resolve().parent
    points, problems = [], []
    for i, values in enumerate(combinations(axes)):
        data = copy.deepcopy(base)
        for k, v in values.items():
            set_path(data, k, v)
        label = ", ".join(f"{k}={v}" for k, v in values.items())
        source = f"{job_file} [sweep {label}]"
        try:
            job = resolve_job_paths(job_from_mapping(data, source), job_folder)
            typed = {k: get_path(to_dict(job), k) for k in values}  # "1e-4" -> 0.0001
            points.append(SweepPoint(i, typed, resolve(job, profile, source=source)))
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise UsageError(f"{len(problems)} of {len(points) + len(problems)} sweep combinations are "
                         "invalid; nothing was submitted:\n" + "\n".join(problems))
    return points


def new_sweep_dir(runs_root: Path, name: str, mode: int = 0o700) -> Path:
    """``<runs root>/sweeps/<name>-<time>-<hex>``: the array's script, submitit pickles and
    batch logs; private like a run folder (``mode``)."""
    return new_private_folder(runs_root / SWEEP_DIR, name, mode)
