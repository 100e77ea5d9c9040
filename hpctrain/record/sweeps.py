"""Sweep folders: the one door every user of one goes through.

``hpctrain submit --sweep`` makes ``<runs root>/sweeps/<sweep id>/``, holding ``sweep.yaml``
(the sweep's runs: index, run id, run folder, values), the job array's script and its batch
logs; each run's ``run.yaml`` records ``sweep: {id, dir, index, values}``. Both are files that
anyone who can write the runs root can edit, so what they name is checked here before anything
is read from it or written to it:

* :func:`find_sweep` — a SWEEP argument (a folder, or an id under ``<runs root>/sweeps/``);
* :func:`read_sweep` — ``sweep.yaml`` read through the run-folder reader (a regular file,
  bounded, the strict YAML loader), its fields typed (``reader.sweep_file_problem``): what is
  wrong is one ``RunFileError`` line naming the file and the field;
* :func:`sweep_runs` — the run folders it lists: an entry that is not a run folder of this
  sweep is refused, naming the entry; a run of the sweep whose folder is gone (removed with
  ``hpctrain runs rm``) is left out with a note;
* :func:`sweep_folder_of` — the sweep folder a run's ``run.yaml`` names, only when it really
  is that run's sweep folder (under a runs root's ``sweeps/``, named by the sweep's id, not a
  run folder, with a readable ``sweep.yaml`` that lists the run): the trackers keep the sweep's
  MLflow parent run there, so a ``sweep.dir`` edited to name another run's folder (or ``/``)
  is never written to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..file_door import show
from . import reader
from .files import RUN_FILE, RunFileError, is_run_folder

SWEEP_DIR = "sweeps"            # <runs root>/sweeps/<sweep id>/
SWEEP_FILE = "sweep.yaml"


@dataclass(frozen=True)
class SweepEntry:
    """One run ``sweep.yaml`` lists; ``position`` is its place in ``runs`` (for messages)."""

    position: int
    run_dir: Path
    run: str | None
    index: int | None
    values: dict


@dataclass
class Sweep:
    path: Path
    id: str
    entries: list[SweepEntry]
    data: dict = field(repr=False)      # the whole mapping, as read (its writer keeps the rest)

    @property
    def file(self) -> Path:
        return self.path / SWEEP_FILE

    def lists(self, run_path: Path | str) -> bool:
        """Whether one of the entries is the run folder ``run_path``."""
        target = os.path.realpath(run_path)
        return any(os.path.realpath(e.run_dir) == target for e in self.entries)


def holds_sweep_file(folder: Path | str) -> bool:
    """A folder with a ``sweep.yaml`` (whatever it is: :func:`read_sweep` says what is wrong
    with it) that is not a run folder; nothing is opened."""
    return (os.path.isdir(folder) and os.path.lexists(os.path.join(folder, SWEEP_FILE))
            and not is_run_folder(Path(folder)))


def find_sweep(ref: str, root: Path) -> Path | None:
    """The sweep folder a SWEEP argument names: a folder holding ``sweep.yaml``, or a sweep's
    id under ``<runs root>/sweeps/``; None when ``ref`` names no sweep (it may name a run)."""
    if not isinstance(ref, str) or not ref.strip() or "\0" in ref:
        return None
    candidates = [Path(ref).expanduser()]
    if "/" not in ref and ref not in (".", ".."):
        candidates.append(Path(root) / SWEEP_DIR / ref)
    for folder in candidates:
        if holds_sweep_file(folder):
            return folder.resolve()
    return None


def read_sweep(folder: Path | str) -> Sweep:
    """The sweep of ``folder``: its ``sweep.yaml`` read and typed. Missing, unreadable, or a
    field of the wrong type: one ``RunFileError`` line naming the file, the field and the fix
    (nothing is changed)."""
    folder = Path(folder)
    path = folder / SWEEP_FILE
    data = reader.read_mapping(path, "sweep file")
    if data is None:
        raise RunFileError(f"{show(folder)} is not a sweep folder (it holds no {SWEEP_FILE}); "
                           f"give a sweep's id or its folder under <runs root>/{SWEEP_DIR}/")
    problem = reader.sweep_file_problem(data)
    if problem:
        raise reader.DamagedFile(path, problem, f"cannot read {show(path)}: {problem} (nothing "
                                                "was changed: repair or restore it)")
    entries = [SweepEntry(i, Path(e["run_dir"]), e.get("run"), e.get("index"),
                          e.get("values") or {}) for i, e in enumerate(data["runs"])]
    return Sweep(folder, str(data.get("id") or folder.name), entries, data)


def sweep_runs(sweep: Sweep, note: Callable[[str], None]) -> list:
    """The run folders ``sweep`` lists, in its order. A run folder that no longer exists (a run
    removed with ``hpctrain runs rm``) is left out and ``note`` is told; an entry naming a
    folder that is not a run folder of this sweep (``/``, another sweep's run) is refused,
    naming the entry."""
    from .folder import RunFolder
    runs = []
    for e in sweep.entries:
        where = f"{show(sweep.file)}: runs[{e.position}].run_dir"
        if not os.path.lexists(e.run_dir):
            note(f"sweep {show(sweep.id)}: run {show(e.run or e.run_dir.name)} is left out: its "
                 f"folder {show(e.run_dir)} no longer exists (removed with `hpctrain runs rm`?)")
            continue
        if not is_run_folder(e.run_dir):
            raise RunFileError(f"{where}: {show(e.run_dir)} is not a run folder (it holds no "
                               f"{RUN_FILE}); a sweep lists its own runs' folders: repair "
                               f"{SWEEP_FILE} or remove the entry")
        run = RunFolder(e.run_dir)
        recorded = run.meta().get("sweep") or {}
        if str(recorded.get("id")) != sweep.id:
            said = f"sweep {show(recorded.get('id'))}" if recorded else "no sweep"
            raise RunFileError(f"{where}: {run.shown} is not a run of sweep {show(sweep.id)} "
                               f"(its {RUN_FILE} records {said}): repair {SWEEP_FILE} or remove "
                               "the entry")
        runs.append(run)
    return runs


def sweep_folder_of(run_path: Path | str, recorded: dict) -> tuple[Path | None, str]:
    """The sweep folder ``run.yaml``'s ``sweep`` (``recorded``) names, when it is the sweep
    folder of the run at ``run_path``; else None and why it is not (for a warning)."""
    text = recorded.get("dir")
    if not isinstance(text, str) or not text:
        return None, "run.yaml's sweep records no dir"
    folder = Path(text)
    if (not folder.is_absolute() or folder.parent.name != SWEEP_DIR
            or folder.name != str(recorded.get("id"))):
        return None, (f"run.yaml's sweep.dir {show(text)} is not <runs root>/{SWEEP_DIR}/"
                      f"{show(recorded.get('id'))}")
    if os.path.islink(folder) or not folder.is_dir() or is_run_folder(folder):
        return None, f"{show(text)} is not a sweep folder"
    try:
        sweep = read_sweep(folder)
    except RunFileError as e:
        return None, str(e)
    if not sweep.lists(run_path):
        return None, f"{show(sweep.file)} does not list this run"
    return folder, ""


__all__ = ["SWEEP_DIR", "SWEEP_FILE", "Sweep", "SweepEntry", "find_sweep", "holds_sweep_file",
           "read_sweep", "sweep_folder_of", "sweep_runs"]
