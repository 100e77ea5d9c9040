"""Rank-side probe: a peer that stops answering during a background save's completion
agreement, through the runtime's save-fault door.

Two ranks form a gloo group whose collectives time out after ``TIMEOUT_S`` and schedule a
background save with megatron-core's own ``AsyncCallsQueue`` (as the checkpointer does). Rank 1
then stops itself (SIGSTOP: alive, holding its sockets, answering nothing); rank 0 finishes the
save as the training loop does (``maybe_finalize_async_calls``, inside
:func:`save_faults_in_one_line`), which must agree with every rank that the writers are done.
Rank 0 writes what came out of the door to ``OUT`` (JSON) and ends rank 1.

    python -m tests.runtime.async_peer_probe ROOT OUT
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from pathlib import Path

TIMEOUT_S = 10      # how long rank 0 waits for the stopped rank (which never answers)


def main(argv: list[str] | None = None) -> int:
    root, out = map(Path, (sys.argv[1:] if argv is None else argv)[:2])
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.strategies.async_utils import (AsyncCallsQueue,
                                                                          AsyncRequest)

    from hpctrain.identity import rank_env
    from hpctrain.runtime.checkpoint.save_faults import SaveFault, save_faults_in_one_line

    renv = rank_env()
    store = dist.TCPStore(renv.master_addr, renv.master_port, renv.world_size,
                          is_master=renv.rank == 0, wait_for_workers=True,
                          timeout=datetime.timedelta(seconds=600))   # a loaded machine's start
    dist.init_process_group("gloo", store=store, rank=renv.rank, world_size=renv.world_size,
                            timeout=datetime.timedelta(seconds=600))
    pids = [None] * renv.world_size
    dist.all_gather_object(pids, os.getpid())        # every rank is up and connected
    # from here on a collective waits TIMEOUT_S for its peers (the default group's timeout is
    # what megatron-core's completion agreement uses)
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=TIMEOUT_S))
    queue = AsyncCallsQueue(persistent=False)
    queue.schedule_async_request(AsyncRequest(async_fn=None, async_fn_args=(), finalize_fns=[]))
    if renv.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)          # alive, silent: rank 0 ends it
        return 0
    logged: list[str] = []
    outcome: dict = {}
    try:
        with save_faults_in_one_line(step=6, path=root, newest=lambda: f"{root}/step-00000003",
                                     run_id="tiny-20260101-000000-ab12", log=logged.append):
            queue.maybe_finalize_async_calls(blocking=True)
        outcome["finished"] = True
    except SaveFault as e:
        outcome = {"fault": str(e), "logged": "\n".join(logged)}
    except BaseException as e:   # noqa: BLE001 - the test shows what the door let through
        outcome = {"escaped": f"{type(e).__name__}: {e}"}
    out.write_text(json.dumps(outcome))
    os.kill(pids[1], signal.SIGKILL)
    os._exit(0)        # the stopped peer's sockets: nothing to tear down cleanly


if __name__ == "__main__":
    sys.exit(main())
