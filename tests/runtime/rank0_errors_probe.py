"""One of two gloo ranks running :func:`hpctrain.runtime.collectives.on_rank0`: prints, as JSON,
what each case gave this rank (a value, or the error's type and message)::

    python tests/runtime/rank0_errors_probe.py RANK STORE_FILE

The group's timeout is short: a rank left alone in a collective fails the probe with a
timeout instead of hanging the test.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from hpctrain.record.checkpoint_store import CheckpointError
from hpctrain.record.reader import DamagedFile
from hpctrain.runtime.collectives import all_gather_floats, barrier, on_rank0, start_sum

rank = int(sys.argv[1])
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 2), rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))


def damaged():
    raise DamagedFile("/runs/x/events.jsonl", "not JSON")


def refused():
    raise CheckpointError("checkpoint folder /ck belongs to run other-run")


cases = {"value": lambda: f"picked by rank {rank}", "checkpoint_error": refused,
         "unpicklable_error": damaged}
seen = {}
for name, work in cases.items():
    try:
        seen[name] = {"value": on_rank0(work, rank == 0)}
    except Exception as e:  # noqa: BLE001
        seen[name] = {"error": type(e).__name__, "message": str(e)}
t = torch.ones(1)
dist.all_reduce(t)           # both ranks are still in step after the errors
seen["in_step"] = t.item()
# the loop's agreement: [loss, reporters, a flag only rank 1 raised], summed asynchronously
agreement = start_sum(torch.tensor([float(rank), 1.0, float(rank == 1)], dtype=torch.float64))
seen["agreement"] = agreement()
seen["gathered"] = all_gather_floats([float(rank), 10.0 * rank + 1])
# a rank leaves the barrier only once every rank reached it: rank 0 comes half a second late
import time  # noqa: E402
if rank == 0:
    time.sleep(0.5)
    seen["reached_barrier_at"] = time.time()
barrier()
seen["left_barrier_at"] = time.time()
print(json.dumps(seen), flush=True)
dist.destroy_process_group()
os._exit(0)
