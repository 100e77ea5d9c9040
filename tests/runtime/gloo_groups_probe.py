"""A process with 24 gloo groups (world size 1), their devices shared or not: prints what the
test compares as JSON (threads, the group timeouts torch set, a collective's result)::

    python tests/runtime/gloo_groups_probe.py share|own

It then destroys the groups and leaves without the interpreter's teardown (``os._exit``): the
probe measures the groups, not the order in which CPython's finalization frees torch's C++
objects (once in many hundred runs a gloo thread met that teardown with SIGABRT, "terminate
called without an active exception", after the JSON was out).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

if sys.argv[1] == "share":
    from hpctrain.runtime.gloo_groups import share_one_device
    assert share_one_device()
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
groups = [dist.new_group([0], backend="gloo") for _ in range(24)]
sums = []
for g in groups:
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    sums.append(t.tolist())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=7))
print(json.dumps({"threads": len(os.listdir("/proc/self/task")), "sums": sums,
                  "warnings": [str(w.message) for w in caught],
                  "is_gloo": isinstance(dist.group.WORLD._get_backend(torch.device("cpu")),
                                        dist.ProcessGroupGloo)}))
dist.destroy_process_group()
del g, groups
sys.stdout.flush()
os._exit(0)
