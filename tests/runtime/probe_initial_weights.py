"""Rank-side probe for tests: build a run's model on its layout exactly as the runtime does
(seeds, device initialization; no checkpoint, no training) and write, per rank, a digest of
each transformer layer's freshly drawn weights keyed by its global layer number.

    python -m tests.runtime.probe_initial_weights RUN_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    run_dir, out_dir = (sys.argv[1:] if argv is None else argv)[:2]
    from hpctrain.identity import rank_env
    from hpctrain.record.folder import RunFolder
    from hpctrain.runtime import distributed
    from hpctrain.runtime.digest import local_digest
    from hpctrain.runtime.entry import resolve_layout
    from hpctrain.runtime.model import build_model_chunks, initialize_parallel, transformer_config

    run = RunFolder(Path(run_dir))
    renv = rank_env()
    job, profile = run.resolved_job(), run.resolved_profile()
    layout = resolve_layout(job, profile, renv.world_size)
    device = distributed.choose_device(profile)
    distributed.prepare_device(device, renv)
    distributed.init_process_group(renv, device, 60)
    initialize_parallel(layout, job.train.seed)
    from megatron.core import parallel_state as ps
    chunks = build_model_chunks(job, layout, device, transformer_config(job, layout, device))
    layers = {str(layer.layer_number): local_digest([layer])
              for chunk in chunks for layer in chunk.decoder.layers}
    record = {"rank": renv.rank, "pp_rank": ps.get_pipeline_model_parallel_rank(),
              "tp_rank": ps.get_tensor_model_parallel_rank(), "layers": layers}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"rank-{renv.rank}.json").write_text(json.dumps(record))
    distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
