"""One of three gloo ranks, each on a node of its own, running hpctrain's straggler watch
(:class:`hpctrain.runtime.straggler_timing.StragglerWatch`) over a real compute timer; rank 2
burns ``BURN_S`` of CPU time per step (a slower device). Prints, as JSON, what each log step
decided on this rank::

    python tests/runtime/straggler_watch_probe.py RANK STORE_FILE RUN_FOLDER MAY_EXCLUDE EXCLUDED

``EXCLUDED``: nodes this run already stopped for (comma-separated, or empty).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from types import SimpleNamespace as NS

import torch.distributed as dist

from hpctrain.record.folder import RunFolder
from hpctrain.runtime.straggler_timing import ComputeTimer, StragglerWatch, burn_cpu

# the log intervals' lengths differ (1 and 2 steps): what is compared is per step
WORLD, STEPS_PER_LOG, WINDOW, BURN_S = 3, (1, 2, 1, 2), 2, 0.05

rank = int(sys.argv[1])
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], WORLD), rank=rank,
                        world_size=WORLD, timeout=datetime.timedelta(seconds=60))
run = RunFolder(sys.argv[3])
ctx = NS(job=NS(health=NS(straggler_factor=1.5, straggler_window=WINDOW)), world_size=WORLD,
         env=NS(node=f"node-{rank}"), is_rank0=rank == 0, run=run, attempt=2, device="cpu")
timer = ComputeTimer("cpu", extra_s=BURN_S if rank == 2 else 0.0)
watch = StragglerWatch(ctx, timer, may_exclude=sys.argv[4] == "1",
                       excluded_before={n for n in sys.argv[5].split(",") if n},
                       flops_per_step=3e12)
decisions = []
step = 0
for steps in STEPS_PER_LOG:
    for _ in range(steps):
        step += 1
        timer.step_begin()
        burn_cpu(0.005)                 # every rank's own work
        timer.start()                   # the forward pass (rank 2 burns its extra here)
        timer.stop()
        timer.step_end()
        watch.step_done()
    named, exclude = watch.at_log_step(step)
    decisions.append({"step": step, "named": [(n.node, n.ranks, n.intervals) for n in named],
                      "exclude": exclude.node if exclude else None,
                      "compute_s": watch.last["compute_s"], "tflops": "tflops" in watch.last})
print(json.dumps(decisions), flush=True)
dist.destroy_process_group()
os._exit(0)
