"""What rank 0 does alone before a collective ends the same way on every rank
(:func:`hpctrain.runtime.collectives.on_rank0`; two real gloo processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("rank0_errors_probe.py")


def test_rank0s_result_or_error_reaches_every_rank(tmp_path):
    store = tmp_path / "store"
    repo = PROBE.parents[2]      # this tree's hpctrain, whichever one is installed
    procs = [subprocess.Popen([sys.executable, str(PROBE), str(r), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=repo, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                                             "PYTHONWARNINGS": "ignore",
                                             "PYTHONPATH": str(repo)}) for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    zero, one = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    # the work ran on rank 0 only, and rank 1 got its result
    assert zero["value"] == one["value"] == {"value": "picked by rank 0"}
    # rank 0's error is raised on rank 1 too, same type and message
    refused = {"error": "CheckpointError",
               "message": "checkpoint folder /ck belongs to run other-run"}
    assert zero["checkpoint_error"] == one["checkpoint_error"] == refused
    # an error that does not survive pickling arrives as a RuntimeError naming it
    assert zero["unpicklable_error"]["error"] == "DamagedFile"
    assert one["unpicklable_error"] == {
        "error": "RuntimeError",
        "message": f"DamagedFile: {zero['unpicklable_error']['message']}"}
    assert zero["in_step"] == one["in_step"] == 2.0
    # the step's agreement: one asynchronous sum of the loss and the flags over the ranks
    assert zero["agreement"] == one["agreement"] == [1.0, 2.0, 1.0]
    # every rank's values, rank r's as element r
    assert zero["gathered"] == one["gathered"] == [[0.0, 1.0], [1.0, 11.0]]
    assert one["left_barrier_at"] >= zero["reached_barrier_at"]


def test_bookkeeping_after_a_publish_is_logged_not_raised(tmp_path, lines):
    """Once a checkpoint is published, rank 0's event, pruning and metrics commit cannot fail
    the attempt (raised on rank 0 alone they would also leave the others in the barrier):
    each failure is logged and the rest still runs. (What the ``hpctrain`` logger says is
    taken by the ``lines`` fixture: a rank's ``runtime.log.setup`` here would leave this test
    process's logger writing to this test's captured output, closed once the test ends, at
    INFO and cut off from the root logger, for every later test on the worker.)"""
    from types import SimpleNamespace

    from hpctrain.record.files import RunFileError
    from hpctrain.runtime.checkpoint.manager import Checkpointer

    committed = []

    def full_disk(*_a, **_k):
        raise RunFileError("cannot write /runs/x/events.jsonl: No space left on device")

    ctx = SimpleNamespace(run=SimpleNamespace(event=full_disk, id="x"), attempt=3,
                          job=SimpleNamespace(checkpoint=SimpleNamespace(keep_last=2)))
    me = SimpleNamespace(ctx=ctx, root=tmp_path, on_published=committed.append)
    Checkpointer._after_publish(me, 40, {"reason": "periodic", "path": "/ck/step-00000040",
                                         "total_seconds": 1.0})
    assert committed == [40]                           # the commit ran after the failure
    assert ("checkpoint: saved step 40, but could not record the save: RunFileError: cannot "
            "write /runs/x/events.jsonl: No space left on device") in lines
