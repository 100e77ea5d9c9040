"""One rank that saves real checkpoints and loads them back across layer implementations.

``python -m tests.runtime.cross_device_probe RUN_DIR OUT_JSON`` (under tests/launch.py):

1. builds the run's model and optimizer (CPU, local spec), takes one optimizer step;
2. saves a full checkpoint through hpctrain's Checkpointer whose model entries have no
   ``_extra_state`` — what layers without extra state write, as the CPU rehearsal's local
   norms do where Transformer Engine's modules have one — and loads it back into the model,
   whose modules ask for their ``_extra_state``;
3. saves one that lacks a real weight (``decoder.final_layernorm.weight``, saved under
   another name) and loads it;
4. loads (1)'s checkpoint as ``train.init_from``.

Writes what happened to OUT_JSON for the test to judge.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    run_dir, out = argv
    from hpctrain.runtime.faults import TestHooks
    from hpctrain.identity import rank_env
    from hpctrain.record.folder import RunFolder
    from hpctrain.runtime import collectives, distributed
    from hpctrain.runtime.checkpoint import state as ckstate
    from hpctrain.runtime.checkpoint.manager import CheckpointError, Checkpointer
    from hpctrain.runtime.checkpoint.weights import load_model_only
    from hpctrain.runtime.context import RankContext
    from hpctrain.runtime.entry import resolve_layout
    from hpctrain.runtime.job_env import job_env
    from hpctrain.runtime.log import setup
    from hpctrain.runtime.model import build_model_and_optimizer, initialize_parallel

    run = RunFolder(Path(run_dir))
    renv = rank_env()
    setup(renv.rank)
    job, profile = run.resolved_job(), run.resolved_profile()
    layout = resolve_layout(job, profile, renv.world_size)
    from hpctrain.planner.layouts import with_optimizer_format
    job = with_optimizer_format(job, profile, layout)   # checkpoint.optimizer_format: auto
    distributed.prepare_device("cpu", renv)
    distributed.init_process_group(renv, "cpu", 60)
    initialize_parallel(layout, job.train.seed)
    mo = build_model_and_optimizer(job, layout, "cpu")
    mo.optimizer.step()
    ctx = RankContext(run=run, job=job, profile=profile, layout=layout, env=renv,
                      job_env=job_env(), attempt=1, device="cpu")
    common = {"step": 1, "consumed_samples": 16, "optimizer_updates": 1, "lr_schedule": {},
              "guard": {}}
    original = ckstate.model_sharded_state
    result = {"requested_extra_state": sorted(
        k for k in original(mo.model)["model"] if k.endswith("_extra_state"))}

    def without(*drop_suffixes):
        def sharded(model):
            sd = original(model)
            return {mk: {k: v for k, v in part.items() if not k.endswith(drop_suffixes)}
                    for mk, part in sd.items()}
        return sharded

    def weights():
        return {n: p.detach().clone() for m in mo.modules for n, p in m.named_parameters()}

    saved_weights = weights()
    root = Path(run_dir) / "checkpoints"

    # 2. no _extra_state in the checkpoint
    ckstate.model_sharded_state = without("_extra_state")
    ckpt = Checkpointer(ctx, mo, root / "no-extra-state", TestHooks.from_env())
    info = ckpt.save(1, common, "final", sync=True)
    ckstate.model_sharded_state = original
    import torch
    with torch.no_grad():
        for m in mo.modules:
            for p in m.parameters():
                p.add_(1.0)
    folder = Path(info["path"])
    from hpctrain.record import checkpoint_store as store
    loaded = ckpt.load(folder, store.read_manifest(folder))
    now = weights()
    result["extra_state_load"] = {
        "step": loaded.step,
        "weights_equal": all(torch.equal(now[n], saved_weights[n]) for n in saved_weights)}

    # 3. a real weight missing: saved under another name (the optimizer still finds its param)
    def renamed(model):
        sd = original(model)
        for part in sd.values():
            for k, sh in part.items():
                if k.endswith("final_layernorm.weight"):
                    sh.key = "renamed." + sh.key
        return sd

    ckstate.model_sharded_state = renamed
    ckpt2 = Checkpointer(ctx, mo, root / "no-final-norm", TestHooks.from_env())
    info2 = ckpt2.save(1, common, "final", sync=True)
    ckstate.model_sharded_state = original
    try:
        folder2 = Path(info2["path"])
        ckpt2.load(folder2, store.read_manifest(folder2))
        result["missing_weight"] = "loaded"
    except CheckpointError as e:
        result["missing_weight"] = str(e)

    # 4. as train.init_from
    with torch.no_grad():
        for m in mo.modules:
            for p in m.parameters():
                p.sub_(1.0)
    load_model_only(mo, folder, is_rank0=True)
    now = weights()
    result["init_from_weights_equal"] = all(torch.equal(now[n], saved_weights[n])
                                            for n in saved_weights)
    collectives.barrier()
    if renv.rank == 0:
        Path(out).write_text(json.dumps(result))
    ckpt.close()
    ckpt2.close()
    distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
