"""Sweeps: ``--sweep train.lr=1e-4,3e-4 --sweep batch.global_batch_size=16,32`` -> one run per
combination (the cartesian product), every one validated like a job file before anything is
submitted.

Values are YAML scalars (``1e-4``, ``true``, ``null``, ``cosine``) checked by the job schema, so
a sweep value gets exactly the error the same value would get in the job file; a value that
breaks the parallel layout on the chosen profile is refused, naming the combination. A relative
path given as a value (``checkpoint.dir``, ``data.path``, ``train.init_from``) is relative to
the job file's folder, as in the job file.

``--set KEY=VALUE`` (validate, render, plan, submit, resume) is parsed by the same function as
``--sweep``: the same keys, values and errors, one value per key; the job with its overrides
is checked as the job file would be.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..config import ClusterProfile, JobConfig, Resolved, job_from_mapping, load_job, resolve, yamlio
from .. import file_door
from ..config import safety
from ..config.loader import resolve_job_paths
from ..config.schema import to_dict
from ..errors import ConfigError, UsageError
from ..record.folder import new_private_folder
from ..record.sweeps import SWEEP_DIR

KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


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
        return label(self.values)


def label(values: Mapping) -> str:
    """``train.lr=0.001, train.steps=200``: values as they read in a message. A key or value
    that is long or not one line of printable text (an API caller's ``"a\\nb"``, a ``run.yaml``
    edited to hold an escape code) is quoted and cut, so the label stays on its one line and
    nothing in it acts on the terminal: what ``status``, ``report`` and ``submit`` print."""
    return ", ".join(f"{_shown(k)}={_shown(v)}" for k, v in values.items())


def _shown(value) -> str:
    """One key or value in the printable form of :func:`hpctrain.file_door.show`; null, true
    and false as a job file spells them (not Python's None, True, False)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**18:
        return safety.short(value)      # str() of a number of thousands of digits raises
    if not isinstance(value, (str, int, float)):   # an API caller's object: its str() may raise
        return safety.short(value)
    return file_door.show(str(value), 60)


def _quoted(text: str) -> str:
    """What the user typed, quoted for a message; cut when long (a list of 2,000 values)."""
    return safety.short(text, 200)


def parse_axis(spec: str, option: str = "--sweep") -> SweepAxis:
    """``train.lr=1e-4,3e-4`` -> SweepAxis('train.lr', (0.0001, 0.0003)). ``option`` names the
    flag in errors: ``--set`` parses its KEY=VALUE with this same function."""
    example = "train.lr=1e-4,3e-4" if option == "--sweep" else "train.lr=3e-4"
    # The text as typed, before YAML reads it: YAML would fold a line break inside a value
    # into a space (``$'a\nb'`` -> ``a b``) and accept what the job file's strings may not hold.
    # A value's length is the job schema's to bound (each field's own limit).
    why = safety.text_problem(spec, limit=max(len(spec), safety.MAX_TEXT))
    if why:
        raise UsageError(f"{option} {_quoted(spec)}: {why}")
    key, sep, rest = spec.partition("=")
    key = key.strip()
    if not sep or not rest.strip():
        shape = "KEY=V1,V2,..." if option == "--sweep" else "KEY=VALUE"
        raise UsageError(f"{option} {_quoted(spec)}: expected {shape} (e.g. {option} {example})")
    if not KEY_RE.match(key):
        raise UsageError(f"{option} {_quoted(spec)}: {_quoted(key)} is not a dotted job-file key "
                         "(e.g. train.lr, batch.global_batch_size)")
    values = []
    for raw in _split_values(rest, f"{option} {_quoted(spec)}"):
        raw = raw.strip()
        if not raw:
            raise UsageError(f"{option} {_quoted(spec)}: empty value in the list")
        try:
            v = yamlio.parse(raw, f"{option} {key}")   # the job file's loader: same meaning
        except ConfigError:
            v = raw
        if isinstance(v, (dict, list)):
            raise UsageError(f"{option} {_quoted(spec)}: {_quoted(raw)} is not a single value")
        values.append(v)
    if len(set(map(repr, values))) != len(values):
        raise UsageError(f"{option} {_quoted(spec)}: a value is listed twice")
    return SweepAxis(key, tuple(values))


def _split_values(text: str, where: str) -> list[str]:
    """The values of ``KEY=V1,V2``: split at the commas outside quotes and brackets, so that a
    quoted value may hold commas (``data.split="969,30,1"``) and a bracketed list stays one
    value (refused as "not a single value", not read as ``'[1'`` and ``'2]'``)."""
    parts, start, quote, depth = [], 0, None, 0
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth = max(depth - 1, 0)
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if quote:
        raise UsageError(f"{where}: a quote ({quote}) is not closed")
    return parts + [text[start:]]


def parse_overrides(specs: list[str] | tuple[str, ...]) -> dict:
    """``--set train.lr=3e-4 --set train.steps=200`` -> ``{"train.lr": 0.0003, ...}``: the
    keys, values and errors of ``--sweep``, one value per key."""
    overrides: dict = {}
    for spec in specs:
        axis = parse_axis(spec, option="--set")
        if len(axis.values) != 1:
            raise UsageError(f"--set {_quoted(spec)}: one value per --set (several values, one run "
                             "each, is --sweep)")
        if axis.key in overrides:
            raise UsageError(f"--set: {axis.key} is given twice")
        overrides[axis.key] = axis.values[0]
    return overrides


def override_mapping(overrides: Mapping | list[str] | tuple[str, ...] | None) -> dict:
    """Overrides as given to the API (``{"train.lr": 3e-4}``) or the CLI (``["train.lr=3e-4"]``),
    as a mapping whose keys are checked as ``--set`` checks them."""
    if not overrides:
        return {}
    if isinstance(overrides, str):
        overrides = [overrides]
    if not isinstance(overrides, Mapping):
        if not isinstance(overrides, (list, tuple)) or \
                not all(isinstance(s, str) for s in overrides):
            raise UsageError(f"overrides: expected a mapping {{'train.lr': 3e-4}} or a list of "
                             f"'KEY=VALUE' strings, got {safety.short(overrides)}")
        return parse_overrides(list(overrides))
    for key in overrides:
        if not isinstance(key, str) or not KEY_RE.match(key):
            raise UsageError(f"overrides: {safety.short(key)} is not a dotted job-file key "
                             "(e.g. train.lr, batch.global_batch_size)")
    return dict(overrides)


def typed_overrides(job: JobConfig, overrides: Mapping) -> dict:
    """``overrides`` as ``job`` (the job they were applied to) holds them: "1e-4" as 0.0001, a
    numpy number as the plain number, a relative path as the absolute one. What ``run.yaml``
    records, as YAML can write it."""
    data = to_dict(job)
    return {key: get_path(data, key) for key in overrides}


def with_overrides(job: JobConfig, overrides: Mapping, folder: Path, source: str) -> JobConfig:
    """``job`` with ``overrides`` applied and checked as the same values in the job file would
    be (a relative path is relative to ``folder``, the job file's)."""
    if not overrides:
        return job
    data = to_dict(job)
    for key, value in overrides.items():
        set_path(data, key, value, option="--set")
    where = f"{source} [--set {label(overrides)}]"
    return resolve_job_paths(job_from_mapping(data, where), folder, where)


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
    from ..limits import sweep_points
    sweep_points([len(a.values) for a in axes])
    keys = [a.key for a in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(a.values for a in axes))]


def set_path(data: dict, key: str, value, option: str = "--sweep") -> None:
    parts = key.split(".")
    node = data
    for i, p in enumerate(parts[:-1]):
        child = node.get(p)
        if not isinstance(child, dict):
            where = ".".join(parts[:i + 1])
            raise UsageError(f"{option} {key}: {where} is not a section of the job file")
        node = child
    node[parts[-1]] = value


def get_path(data: dict, key: str):
    for part in key.split("."):
        data = data[part]
    return data


def expand(job: str | JobConfig, profile: ClusterProfile, specs: list[str], *,
           folder: Path | None = None, source: str | None = None) -> list[SweepPoint]:
    """Every combination as a resolved job on ``profile``; all problems raised at once.
    ``job``: a job file, or a loaded job (with ``--set`` applied) whose relative values are
    relative to ``folder``."""
    axes = parse_axes(specs)
    if isinstance(job, JobConfig):
        base, job_folder, job_file = to_dict(job), folder or Path.cwd(), source or job.name
    else:
        base = to_dict(load_job(job))
        job_folder, job_file = Path(job).resolve().parent, job
    points, problems = [], []
    for i, values in enumerate(combinations(axes)):
        data = copy.deepcopy(base)
        for k, v in values.items():
            set_path(data, k, v)
        where = f"{job_file} [sweep {label(values)}]"
        try:
            point_job = resolve_job_paths(job_from_mapping(data, where), job_folder, where)
            typed = {k: get_path(to_dict(point_job), k) for k in values}  # "1e-4" -> 0.0001
            points.append(SweepPoint(i, typed, resolve(point_job, profile, source=where)))
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        shown = problems[:SHOWN_PROBLEMS]
        more = f"; and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        raise UsageError(f"{len(problems)} of {len(points) + len(problems)} sweep combinations are "
                         "invalid; nothing was submitted: " + "; ".join(shown) + more)
    return points


SHOWN_PROBLEMS = 5    # a sweep's error stays one line: its first invalid combinations, then a count


def new_sweep_dir(runs_root: Path, name: str, mode: int = 0o700) -> Path:
    """``<runs root>/sweeps/<name>-<time>-<hex>``: the array's script, submitit pickles and
    batch logs; private like a run folder (``mode``)."""
    return new_private_folder(runs_root / SWEEP_DIR, name, mode)
