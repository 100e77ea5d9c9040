"""``python -m hpctrain.runtime.init_weights RUN_DIR OUTPUT``: export a run's initial weights.

Megatron initializes each pipeline stage's layers from its own generator, so two layouts do
not start from the same weights even with the same seed. Exporting the initial model once
(model-only, no optimizer) and pointing every run at it with ``train.init_from`` gives
identical starts on any layout: how layouts are compared, and how a run restarted on other
hardware keeps its initialization. Runs on any number of ranks (one is enough).
"""

from __future__ import annotations

import sys
from pathlib import Path


def export_initial_weights(run_dir: str, output: str) -> Path:
    from ..config.layout import Layout
    from ..runs import Run
    from . import distributed
    from .checkpoint.weights import export_model
    from .context import RankContext
    from .env import job_env, rank_env
    from .log import logger, setup
    from .model import build_model_and_optimizer, initialize_parallel
    from .versions import check_megatron_core

    run = Run(Path(run_dir).resolve())
    renv = rank_env()
    setup(renv.rank)
    check_megatron_core()
    job, profile = run.resolved_job(), run.resolved_profile()
    # The weights do not depend on the layout's DP; one stage and no TP keeps it simple.
    layout = Layout(1, 1, None, renv.world_size, job.batch.micro_batch_size,
                    job.batch.micro_batch_size * renv.world_size)
    device = distributed.choose_device(profile)
    distributed.prepare_device(device, renv)
    distributed.init_process_group(renv, device, job.train.init_timeout_s)
    initialize_parallel(layout, job.train.seed)
    mo = build_model_and_optimizer(job, layout, device)
    ctx = RankContext(run=run, job=job, profile=profile, layout=layout, env=renv,
                      job_env=job_env(), attempt=0, device=device)
    out = export_model(ctx, mo, output)
    if ctx.is_rank0:
        logger.info(f"initial weights of {job.name} (seed {job.train.seed}) written to {out}")
    distributed.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> int:
    from ..errors import HpcTrainError
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
