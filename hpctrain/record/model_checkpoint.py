"""Where ``train.init_from`` points, resolved and checked without torch: ``submit`` and
``validate`` refuse a path that holds no checkpoint before the job waits in the queue, and the
ranks resolve the same path by the same rules when they load it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .. import file_door
from . import checkpoint_store as store
from .checkpoint_store import CheckpointError


def resolve(path: str | Path) -> Path:
    """``train.init_from`` may name a checkpoint folder (``step-N`` or a model export), a run's
    checkpoint root (its newest complete checkpoint is used) or a plain dist_checkpointing
    folder."""
    p = Path(path).expanduser()
    if not p.is_dir():
        try:
            mode = os.stat(p).st_mode
        except OSError:
            raise CheckpointError(f"train.init_from: {p} does not exist (give a checkpoint "
                                  f"folder, a checkpoint root or a model export)") from None
        what = "a file" if stat.S_ISREG(mode) else file_door.kind_of(mode)
        raise CheckpointError(f"train.init_from: {p} is {what}, not a folder (give a "
                              f"checkpoint folder, a checkpoint root or a model export)")
    if (p / store.MANIFEST).is_file() or (p / "metadata.json").is_file():
        return p
    for _, d in store.complete_checkpoints(p):
        if not store.manifest_problems(d, store.read_manifest(d)):
            return d
    raise CheckpointError(f"train.init_from: {p} holds no complete checkpoint")


def checked(path: str | Path) -> Path:
    """The folder ``train.init_from`` names (:func:`resolve`), its manifest checked."""
    folder = resolve(path)
    manifest = store.read_manifest(folder)
    if manifest is not None:
        problems = store.manifest_problems(folder, manifest)
        if problems:
            raise CheckpointError(f"train.init_from: {folder} is damaged: "
                                  f"{'; '.join(problems[:3])}")
    return folder
