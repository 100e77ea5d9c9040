"""What a run's checkpoint folder holds, as ``status``, ``resume`` and ``report`` show it.

Reads the folder the runtime publishes into (``step-N/`` with ``manifest.json`` written last, a
``latest`` pointer, ``.partial-*`` leftovers, ``quarantine/``) through the rules the runtime
writes it by (:mod:`hpctrain.record.checkpoint_store`), with the cheap check only (manifest present, every file at its size): the
full CRC check is the runtime's job when it loads. A checkpoint another run saved (its manifest
names that run) is listed as not this run's, never as one to resume from. Never writes or moves
anything.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..record.folder import RunFolder


@dataclass
class CheckpointInfo:
    step: int
    path: str
    complete: bool          # manifest present and every listed file has its size
    bytes: int | None = None
    created: str | None = None
    problem: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CheckpointFolder:
    root: str
    checkpoints: list[CheckpointInfo]  # newest first
    latest: str | None                 # what the ``latest`` pointer names
    partial: int                       # .partial-* folders (a save in progress, or a killed one)
    quarantined: int
    owner: str | None = None           # the run owner.json names (None: not claimed yet)

    @property
    def newest_complete(self) -> CheckpointInfo | None:
        return next((c for c in self.checkpoints if c.complete), None)

    def to_dict(self) -> dict:
        newest = self.newest_complete
        return {"root": self.root, "latest": self.latest, "partial": self.partial,
                "quarantined": self.quarantined, "owner": self.owner,
                "newest_complete": newest.to_dict() if newest else None,
                "checkpoints": [c.to_dict() for c in self.checkpoints]}


def inspect_checkpoints(run: RunFolder) -> CheckpointFolder:
    from ..record import checkpoint_store as store
    root = run.checkpoint_dir()
    found = []
    for step, folder in store.complete_checkpoints(root):
        manifest, damage = read_manifest(folder)
        problems = [damage] if damage else store.manifest_problems(folder, manifest)
        saved_by = (manifest or {}).get("run")
        if saved_by and saved_by != run.id:
            problems = [f"saved by run {saved_by}, not this one"] + problems
        found.append(CheckpointInfo(step=step, path=str(folder), complete=not problems,
                                    bytes=(manifest or {}).get("total_bytes"),
                                    created=(manifest or {}).get("created"),
                                    problem=problems[0] if problems else None))
    qdir = root / store.QUARANTINE
    quarantined = sum(1 for d in qdir.iterdir() if d.is_dir()) if qdir.is_dir() else 0
    try:
        owner = (store.read_owner(root) or {}).get("run")
    except store.ForeignCheckpointsError:
        owner = "(unreadable owner.json)"
    return CheckpointFolder(root=str(root), checkpoints=found, latest=store.read_latest(root),
                            partial=len(store.partial_checkpoints(root)), quarantined=quarantined,
                            owner=owner)


def read_manifest(folder: Path) -> tuple[dict | None, str | None]:
    """A ``step-N`` folder's manifest, read through the run-folder reader and checked field by
    field (``reader.manifest_problem``: every file it names inside the folder, sizes and steps
    integers): (manifest, None); (None, why) when it cannot be used; (None, None) when there is
    none (``manifest_problems`` says so)."""
    from ..record import checkpoint_store as store
    from ..record import reader
    path = folder / store.MANIFEST
    try:
        return reader.read_json(path, check=reader.manifest_problem), None
    except reader.DamagedFile as e:
        return None, f"{store.MANIFEST} cannot be used: {e.why}"


_STEP_NAME = re.compile(r"step-([0-9]{1,18})", re.ASCII)


def describe_checkpoint_ref(value) -> str | None:
    """A ledger/result ``checkpoint_loaded``/``checkpoint_saved`` value, short: ``step 50``."""
    if value in (None, "", False):
        return None
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int):
        return f"step {value}"
    if isinstance(value, dict):
        if value.get("step") is not None:
            return f"step {value['step']}"
        return describe_checkpoint_ref(value.get("path"))
    name = Path(str(value)).name
    m = _STEP_NAME.fullmatch(name)      # ASCII digits only: "step-²" names no step
    if m:
        return f"step {int(m.group(1))}"
    return name


def checkpoint_step(value) -> int | None:
    """The step a ledger/result checkpoint value names, if it names one."""
    text = describe_checkpoint_ref(value)
    m = re.fullmatch(r"step ([0-9]{1,19})", text or "", re.ASCII)
    return int(m.group(1)) if m else None
