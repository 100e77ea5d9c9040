"""``python -m hpctrain.runtime.init_weights RUN_DIR OUTPUT``: export a run's initial weights.

Megatron initializes each pipeline stage's layers from its own generator, so two layouts do
not start from the same weights even with the same seed. Exporting the initial model once
(model-only, no optimizer) and pointing every run at it with ``train.init_from`` gives
identical starts on any layout: how layouts are compared, and how a run restarted on other
hardware keeps its initialization.

Where the model is built: on the job's own TP×PP(×VPP) when the export is launched on a
multiple of TP×PP ranks (``srun -n TP×PP ...``: each rank holds only its shard, so models far
larger than one GPU export), else on one stage without TP (every rank a full copy). Only the
weights are built (no gradient buffers, no optimizer). On a GPU the shard's weights are
checked against the free memory first, and a shard that cannot fit is refused with the number
of ranks that would hold it, before anything is allocated.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from ..errors import HpcTrainError

HEADROOM = 0.9   # leave some of the free memory to the CUDA context, allocator and the save


def export_layout(job, world_size: int):
    """The job's TP×PP×VPP when ``world_size`` is a multiple of TP×PP, else TP1×PP1."""
    from ..config.layout import Layout
    par, mbs = job.parallel, job.batch.micro_batch_size
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    if world_size % (tp * pp) == 0:
        dp = world_size // (tp * pp)
        return Layout(tp, pp, par.virtual_pipeline_model_parallel_size if pp > 1 else None, dp,
                      mbs, mbs * dp)
    return Layout(1, 1, None, world_size, mbs, mbs * world_size)


def shard_bytes(job, layout, device: str) -> int:
    """Bytes of the largest rank's weights on ``layout`` (megatron-core's allocation)."""
    from ..model_shape import PRECISION_BYTES, ModelShape, count_parameters
    count = count_parameters(ModelShape.from_model(job.model), layout.tensor_model_parallel_size,
                             layout.pipeline_model_parallel_size,
                             layout.virtual_pipeline_model_parallel_size)
    precision = job.train.precision if device == "cuda" else "fp32"
    return count.most_loaded_rank * PRECISION_BYTES[precision]


def check_fits(job, layout, world_size: int, free_bytes: int) -> None:
    """Refuse a shard that cannot fit in ``free_bytes`` (one GPU's free memory), with the fix."""
    need = shard_bytes(job, layout, "cuda")
    if need <= HEADROOM * free_bytes:
        return
    par = job.parallel
    tp_pp = par.tensor_model_parallel_size * par.pipeline_model_parallel_size
    on_job_layout = layout.tensor_model_parallel_size * layout.pipeline_model_parallel_size == \
        tp_pp and tp_pp > 1
    fix = ("the job's own layout does not fit one GPU either: raise TP or PP in the job" if
           on_job_layout or tp_pp == 1 else
           f"launch the export on a multiple of TP×PP = {tp_pp} ranks (each builds only its "
           f"shard of the job's {layout_name(job)} layout)")
    raise HpcTrainError(
        f"initial weights of {job.name}: {need / 2**30:.1f} GiB of {job.train.precision} weights "
        f"per GPU on {layout.describe()} ({world_size} rank(s)), but only "
        f"{free_bytes / 2**30:.1f} GiB of GPU memory is free; {fix}, or export on a cpu profile "
        f"(host memory)")


def layout_name(job) -> str:
    par = job.parallel
    return f"TP{par.tensor_model_parallel_size}×PP{par.pipeline_model_parallel_size}"


def build_weights(job, layout, device: str):
    """Only the model chunks (Float16Module around them in 16-bit), as the export needs."""
    from megatron.core.transformer.module import Float16Module

    from . import layers
    from .model import build_model_chunks, transformer_config
    config = transformer_config(job, layout, device)
    chunks = build_model_chunks(job, layout, device, config)
    if config.bf16 or config.fp16:
        chunks = [Float16Module(config, c) for c in chunks]
    return SimpleNamespace(model=[SimpleNamespace(module=c) for c in chunks],
                           layers=layers.choose(job, device))


def export_initial_weights(run_dir: str, output: str) -> Path:
    from ..identity import rank_env
    from ..record.folder import RunFolder
    from . import distributed, layers
    from .checkpoint.weights import export_model
    from .context import RankContext
    from .job_env import job_env
    from .log import logger, setup
    from .model import initialize_parallel
    from .versions import check_megatron_core

    run = RunFolder(Path(run_dir).resolve())
    renv = rank_env()
    setup(renv.rank)
    check_megatron_core()
    job, profile = run.resolved_job(), run.resolved_profile()
    layout = export_layout(job, renv.world_size)
    device = distributed.choose_device(profile)
    layers.choose(job, device)   # no Transformer Engine on CUDA: stop here, with the fix
    distributed.prepare_device(device, renv)
    if device == "cuda":
        import torch
        check_fits(job, layout, renv.world_size, torch.cuda.mem_get_info()[0])
    distributed.init_process_group(renv, device, job.train.init_timeout_s)
    initialize_parallel(layout, job.train.seed)
    weights = build_weights(job, layout, device)
    ctx = RankContext(run=run, job=job, profile=profile, layout=layout, env=renv,
                      job_env=job_env(), attempt=0, device=device)
    out = export_model(ctx, weights, output)
    if ctx.is_rank0:
        logger.info(f"initial weights of {job.name} (seed {job.train.seed}, built on "
                    f"{layout.describe()}) written to {out}")
    distributed.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m hpctrain.runtime.init_weights RUN_DIR OUTPUT", file=sys.stderr)
        return 2
    try:
        export_initial_weights(args[0], args[1])
    except HpcTrainError as e:
        print(f"Error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
