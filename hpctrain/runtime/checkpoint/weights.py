"""Model-only checkpoints: initial weights shared by every layout (``train.init_from``).

Megatron initializes each pipeline stage's layers from its own generator, so two layouts do
not start from the same weights even with one seed. Exporting the weights once and loading
them everywhere gives identical starts: how layouts are compared, and how a run restarted on
other hardware keeps its initialization.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...record import checkpoint_store as store
from ...record.model_checkpoint import checked as checked_model_checkpoint
from .. import collectives
from . import cross_device
from . import state as ckstate
from .manager import CheckpointError, layers_record, versions

def load_model_only(mo, path: str | Path, is_rank0: bool) -> Path:
    """Load weights (no optimizer state, no step) into every layout alike (collective), from
    the folder ``path`` names (:func:`..record.model_checkpoint.checked`).

    Rank 0 alone picks the folder and every rank loads that one: a checkpoint root of a run
    still training changes under the listing (a new step published, an old one pruned), so
    ranks listing it one after the other could load different steps into one model."""
    from megatron.core import dist_checkpointing

    folder = Path(collectives.on_rank0(lambda: str(checked_model_checkpoint(path)), is_rank0))
    template = ckstate.model_sharded_state(mo.model)
    # saved by other layers (the CPU rehearsal's local spec): TE's extra state starts fresh
    kept = cross_device.set_aside_absent_entries(template, folder, "train.init_from:")
    loaded = dist_checkpointing.load(template, str(folder))
    cross_device.put_back(loaded, kept)
    ckstate.load_model_state(mo.model, loaded)
    mo.optimizer.reload_model_params()  # fp32 main copies / distributed shards follow the weights
    return folder


def export_model(ctx, mo, out: str | Path) -> Path:
    """Write the model weights alone (collective): the start every layout can share."""
    from megatron.core import dist_checkpointing

    from .results_queue import install_results_queue
    install_results_queue()   # no lingering writer-results process after this rank exits

    out = Path(out).expanduser().resolve()
    partial = out.with_name(f"{store.PARTIAL_PREFIX}{out.name}")

    def start() -> None:
        if out.exists():
            raise CheckpointError(f"{out} already exists; choose a new folder")
        partial.mkdir(parents=True, exist_ok=False)
    collectives.on_rank0(start, ctx.is_rank0)    # an error reaches every rank, not only rank 0
    dist_checkpointing.save(ckstate.model_sharded_state(mo.model), str(partial))
    collectives.barrier()

    def publish() -> None:
        files = store.checksum_files(partial, store.list_files(partial), durable=True)
        manifest = store.build_manifest(0, files, kind="model", layout=ctx.layout_record(),
                                        versions=versions(), job=ctx.job.name,
                                        seed=ctx.job.train.seed, device=ctx.device,
                                        layers=layers_record(mo))
        store.write_json_atomic(partial / store.MANIFEST, manifest)
        os.rename(partial, out)
        store.fsync_dir(out.parent)
    collectives.on_rank0(publish, ctx.is_rank0)
    return out
