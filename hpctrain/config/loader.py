"""Finding and loading profiles and jobs.

Profiles are found by path, or by name in (first match wins): ``$HPCTRAIN_PROFILE_PATH``
(colon-separated folders), ``~/.config/hpctrain/profiles/``, then the packaged
``cluster_profiles/``. Loading checks everything and raises one ConfigError listing every
problem.
"""

from __future__ import annotations

import os
import dataclasses
import stat
from dataclasses import dataclass
from pathlib import Path

from .. import resources
from ..errors import ConfigError, UsageError
from ..gpu_table import TableError
from .kernel_table import builtin_table, load_table
from . import yamlio
from . import safety
from .job import JobConfig, check_job
from .layout import Layout, layout_problems
from .problems import Problems
from .resilience import effective as effective_resilience
from .profile import MAX_WORLD_SIZE, ClusterProfile, check_profile
from .schema import build, did_you_mean, to_dict

DEFAULT_PROFILE = "local"


PROFILE_PATH_VARIABLE = "HPCTRAIN_PROFILE_PATH"


def profile_search_path() -> list[Path]:
    """The folders profiles are found in by name: ``$HPCTRAIN_PROFILE_PATH``'s (colon-separated,
    read here and nowhere else), ``~/.config/hpctrain/profiles``, the packaged ones.

    An empty entry of the variable (``a::b``, a trailing ``:``) and a folder that does not
    exist (a share not mounted on this node) are skipped, as ``$PATH`` skips them. An entry
    that can never be a folder of profiles (a file, as when the variable names one profile
    file; a FIFO; a line break or a control character; a name too long; a symlink loop) is
    one UsageError naming the variable, the entry and the fix: skipped silently, its profiles
    would just be "unknown". A home folder that cannot be looked in is skipped."""
    dirs = []
    for entry in os.environ.get(PROFILE_PATH_VARIABLE, "").split(":"):
        if entry and _profile_folder(entry):
            dirs.append(Path(entry))
    try:
        dirs.append(Path.home() / ".config" / "hpctrain" / "profiles")
    except RuntimeError:     # no $HOME and no password entry: no home folder to look in
        pass
    dirs.append(resources.profiles_dir())
    return dirs


def _profile_folder(entry: str) -> bool:
    """Whether ``entry`` of ``$HPCTRAIN_PROFILE_PATH`` is a folder (False: it does not exist);
    UsageError when it cannot be one."""
    fix = "the variable lists folders of profile files, separated by ':'; fix it or unset it"
    why = safety.text_problem(entry, safety.PATH_MAX) or safety.path_problem(entry)
    if why:
        raise UsageError(f"${PROFILE_PATH_VARIABLE}: the entry {safety.short(entry)} {why}; {fix}")
    try:
        st = os.stat(entry)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise UsageError(f"${PROFILE_PATH_VARIABLE}: the entry {entry}: {e.strerror}; {fix}") \
            from None
    if not stat.S_ISDIR(st.st_mode):
        from ..file_door import kind_of
        kind = "a file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
        hint = " (give one profile file with --profile FILE)" if stat.S_ISREG(st.st_mode) else ""
        raise UsageError(f"${PROFILE_PATH_VARIABLE}: the entry {entry} is {kind}, not a folder"
                         f"{hint}; {fix}")
    return True


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:      # a home folder whose path is too long, or that cannot be looked in
        return False


def list_profiles() -> dict[str, Path]:
    """name -> file for every profile on the search path (earlier folders win)."""
    found: dict[str, Path] = {}
    for d in profile_search_path():
        if not _is_folder(d):
            continue
        for f in sorted(d.glob("*.yaml")) + sorted(d.glob("*.yml")):
            found.setdefault(f.stem, f)
    return found


def find_profile(name_or_path: str | os.PathLike) -> Path:
    name_or_path = os.fspath(name_or_path)   # the Python API takes Paths too
    why = safety.text_problem(name_or_path, safety.PATH_MAX) or safety.path_problem(name_or_path)
    if why:
        raise UsageError(f"--profile: {safety.short(name_or_path)} {why}")
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or os.sep in name_or_path:
        if not (p.exists() or p.is_symlink()):
            raise UsageError(f"profile file {p} does not exist")
        return p  # read_mapping refuses what is not a regular YAML file, with the reason
    found = list_profiles()
    if name_or_path in found:
        return found[name_or_path]
    names = ", ".join(sorted(found)) or "none"
    raise UsageError(f"unknown profile {name_or_path!r}{did_you_mean(name_or_path, found)}; "
                     f"known profiles: {names} (or give a path to a .yaml file)")


def _cross_check(check, obj, problems: Problems) -> None:
    """Run cross-field checks even when some fields failed their type check, so the user sees
    every problem at once; checks that trip over a broken field (None) are skipped."""
    try:
        check(obj, problems)
    except (AttributeError, TypeError):
        if not problems:
            raise


def profile_from_mapping(data: dict, source: str, default_name: str = "",
                         base: Path | None = None) -> ClusterProfile:
    problems = Problems()
    profile = build(ClusterProfile, data, "", problems)
    _cross_check(check_profile, profile, problems)
    if not problems:
        _check_kernel_table(profile, base, problems)
    if not profile.name and default_name and not safety.JOB_NAME.fullmatch(default_name):
        problems.add("name", f"missing, and the file name {safety.short(default_name)} is not a "
                             "valid profile name (1-128 of letters, digits and _.+-, not "
                             "starting with - or .): set `name`")
    if problems:
        raise ConfigError(source, problems.items)
    if not profile.name:
        profile.name = default_name
    return profile


def load_profile(name_or_path: str | os.PathLike | ClusterProfile | None = None) -> ClusterProfile:
    """A profile by name or file, checked; or a :class:`ClusterProfile` given as an object
    (the Python API takes one), checked again as its file would be and returned as a new one:
    ``dataclasses.replace`` and attribute assignment skip every check, and a profile with
    ``gpus_per_node: 0`` or ``scheduler: "bogus"`` would otherwise reach the planner and the
    template. The one door every profile goes through."""
    if isinstance(name_or_path, ClusterProfile):
        return _checked_profile(name_or_path)
    path = find_profile(DEFAULT_PROFILE if name_or_path is None else name_or_path)
    return profile_from_mapping(yamlio.read_mapping(path, "profile"), str(path), path.stem,
                                base=path.resolve().parent)


def _checked_profile(profile: ClusterProfile) -> ClusterProfile:
    name = getattr(profile, "name", None)
    source = f"profile {safety.short(name)}" if isinstance(name, str) and name else "profile"
    try:
        data = to_dict(profile)
    except RecursionError:
        raise ConfigError(source, [("", "holds itself (a mapping or list that contains "
                                        "itself); build it from plain values")]) from None
    checked = profile_from_mapping(data, source)
    if not checked.name:
        raise ConfigError(source, [("name", "missing; a profile built in Python needs a name "
                                            "(1-128 of letters, digits and _.+-)")])
    return checked


def _check_kernel_table(profile: ClusterProfile, base: Path | None, problems: Problems) -> None:
    """``node.kernel_table``: made absolute against the profile's folder and read once here, so
    a missing or malformed table is one error at load, not a failure inside the planner."""
    table = profile.node.kernel_table
    if not isinstance(table, str):
        return
    try:
        path = builtin_table(table) or Path(os.path.expanduser(table))
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        load_table(path)
    except TableError as e:
        problems.add("node.kernel_table", f"{e}; measure one with `hpctrain bench kernels -o "
                                          "FILE` on a GPU of this kind, or set it to null")
        return
    profile.node.kernel_table = str(path.resolve())


def job_from_mapping(data: dict, source: str) -> JobConfig:
    problems = Problems()
    job = build(JobConfig, data, "", problems)
    _cross_check(check_job, job, problems)
    if problems:
        raise ConfigError(source, problems.items)
    return job


def load_job(path: str | os.PathLike) -> JobConfig:
    """Load a job file. ``data.path``, ``data.prepare_from`` and ``train.init_from`` are made
    absolute relative to the job file, so the resolved job works from any folder."""
    p = Path(path)
    job = job_from_mapping(yamlio.read_mapping(p, "job file"), str(p))
    return resolve_job_paths(job, p.resolve().parent)


def resolve_job_paths(job: JobConfig, base: Path) -> JobConfig:
    """Make the job's paths absolute, relative ones against ``base`` (the job file's folder;
    absolute ones stay as they are): the same for a job file and for a sweep's values."""
    def resolved(f: str, field: str) -> str:
        try:
            return str((base / os.path.expanduser(f)).resolve())
        except RuntimeError:        # Path.resolve on a symlink loop (Python 3.11)
            raise ConfigError("job", [(field, f"{safety.short(f)}: too many levels of symbolic "
                                              "links (a symlink loop?); give a path that leads "
                                              "somewhere")]) from None
        except OSError as e:
            raise ConfigError("job", [(field, f"{safety.short(f)}: {e.strerror}; give a path "
                                              "this machine can resolve")]) from None

    d = job.data
    if d.path:
        d.path = resolved(d.path, "data.path")
    d.prepare_from = [resolved(f, f"data.prepare_from[{i}]") for i, f in enumerate(d.prepare_from)]
    for name in ("blend", "valid_blend", "test_blend"):
        for i, entry in enumerate(getattr(d, name)):
            entry.path = resolved(entry.path, f"data.{name}[{i}].path")
            entry.prepare_from = [resolved(f, f"data.{name}[{i}].prepare_from[{k}]")
                                  for k, f in enumerate(entry.prepare_from)]
    if d.tokenizer != "byte":
        d.tokenizer = resolved(d.tokenizer, "data.tokenizer")
    if job.train.init_from:
        job.train.init_from = resolved(job.train.init_from, "train.init_from")
    if job.checkpoint.dir:
        job.checkpoint.dir = resolved(job.checkpoint.dir, "checkpoint.dir")
    wandb = job.tracking.wandb if job.tracking is not None else None
    if wandb is not None and wandb.dir:
        wandb.dir = resolved(wandb.dir, "tracking.wandb.dir")
    _check_resolved_paths(job)
    return job


def _check_resolved_paths(job: JobConfig) -> None:
    """A path that became too long once made absolute is refused here, by field, rather than
    as ENAMETOOLONG from whatever first touches it."""
    problems = Problems()
    d = job.data
    fields = [("data.path", d.path), ("train.init_from", job.train.init_from),
              ("checkpoint.dir", job.checkpoint.dir)]
    fields += [(f"data.prepare_from[{i}]", f) for i, f in enumerate(d.prepare_from)]
    for name in ("blend", "valid_blend", "test_blend"):
        for i, e in enumerate(getattr(d, name)):
            fields.append((f"data.{name}[{i}].path", e.path))
            fields += [(f"data.{name}[{i}].prepare_from[{k}]", f)
                       for k, f in enumerate(e.prepare_from)]
    if d.tokenizer != "byte":
        fields.append(("data.tokenizer", d.tokenizer))
    for path, value in fields:
        if value and not_utf8(value):
            problems.add(path, f"resolved against the job file's folder, the path {safety.short(value)} "
                               "holds bytes that are not UTF-8 text (a folder name in another "
                               "encoding?); the run's job.yaml could not hold it: rename the "
                               "folder to UTF-8 or give an absolute UTF-8 path")
            continue
        why = value and safety.path_problem(value)
        if why:
            problems.add(path, f"resolved against the job file's folder, the path {why}")
    if problems:
        raise ConfigError("job", problems.items)


def not_utf8(text: str) -> bool:
    """A path whose bytes are not UTF-8 reaches Python as lone surrogates (surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@dataclass
class Resolved:
    """A job on a profile, checked together: what render, plan, submit and the runtime use."""

    job: JobConfig
    profile: ClusterProfile
    layout: Layout
    source: str = "job"


def resolve(job: JobConfig, profile: ClusterProfile, source: str = "job") -> Resolved:
    """Cross-check a job against a profile; raise one ConfigError with every problem."""
    problems = Problems()
    if profile.world_size > MAX_WORLD_SIZE:
        raise ConfigError(f"profile {profile.name!r}", [(
            "slurm.nodes", f"{profile.slurm.nodes} node(s) × {profile.slurm.gpus_per_node} GPUs = "
                           f"{profile.world_size:,} ranks; hpctrain plans and runs at most "
                           f"{MAX_WORLD_SIZE:,}")])
    layout = layout_problems(job, profile.world_size, profile.slurm.gpus_per_node, problems)
    # the job's resilience settings, where it has them, are the profile's for this job
    profile = dataclasses.replace(profile, resilience=effective_resilience(job, profile))
    if problems:
        raise ConfigError(f"{source} on profile {profile.name!r} "
                          f"({profile.slurm.nodes} node(s) × {profile.slurm.gpus_per_node} GPUs)",
                          problems.items)
    return Resolved(job=job, profile=profile, layout=layout, source=source)
