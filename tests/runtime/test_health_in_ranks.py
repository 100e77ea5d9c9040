"""The health watchdog inside real ranks (real megatron-core over gloo, no batch shell): a rank
that blocks forever in one of megatron-core's collectives is named by the ranks themselves,
every rank writes its stacks and exits; a rank slowed on purpose is named in the metrics."""

from __future__ import annotations

import json
import re

import pytest

from hpctrain import exit_codes
from hpctrain.health.hang import read_verdict
from tests.launch import Launch

# a native frame in py-spy's output: a shared library's function (libc's, whatever the
# Python build: a static one has no libpython)
NATIVE_FRAME = re.compile(r"\(lib[\w.+-]*\.so[\d.]*\)")

pytestmark = pytest.mark.megatron


def test_a_rank_blocked_in_a_megatron_collective_is_named_and_every_rank_dumps_and_exits(ws):
    run = ws.new_run("hang-collective", "dp2_zero1", steps=12, health={"hang_timeout_s": 10})
    launch = Launch(run.path, 2, env={"HPCTRAIN_TEST_HANG_IN_COLLECTIVE": "5@1"},
                    kill_on_failure=False)
    res = launch.wait(timeout=300)
    assert res.codes == [exit_codes.HUNG, exit_codes.HUNG], \
        f"{res.codes}\n{res.tail(0)}\n{res.tail(1)}"
    folder = run.attempt_dir(1)
    verdict = read_verdict(folder)
    assert verdict is not None and verdict.rank == 1, verdict
    assert verdict.step == 4 and verdict.decided_by.startswith("rank "), verdict
    assert "wait in a collective it never issued" in verdict.why, verdict.why
    assert verdict.idle_s > 10
    stacks = {r: (folder / f"stacks-rank-{r}.txt").read_text() for r in (0, 1)}
    # rank 1 sleeps in the injected collective, called from megatron-core's grad-norm code;
    # rank 0 waits inside the real collective, in megatron-core
    assert "block_next_megatron_collective" in stacks[1] or "runtime/faults.py" in stacks[1]
    assert "megatron/core" in stacks[1] and "megatron/core" in stacks[0], stacks[0]
    assert all("most recent call first" in text for text in stacks.values())
    # native frames too: py-spy is installed with the test dependencies
    assert all("py-spy dump --native" in text and NATIVE_FRAME.search(text)
               for text in stacks.values()), stacks[0][-2000:]
    beats = {r: json.loads((folder / "heartbeat" / f"rank-{r}.json").read_text()) for r in (0, 1)}
    assert beats[0]["step"] == beats[1]["step"] == 4


def test_a_slow_rank_is_named_in_the_metrics_and_the_run_goes_on(ws):
    run, _ = ws.train("slow-rank", "dp2_zero1", steps=6,
                      env={"HPCTRAIN_TEST_SLOW_RANK": "1:0.2"},
                      health={"straggler_window": 2, "exclude_stragglers": True})
    records = [m for m in run.metrics() if m.get("step")]
    named = {m["step"]: m["stragglers"] for m in records}
    assert named[1] == [], named                    # one slow interval is not yet a straggler
    for step in range(2, 7):
        (slow,) = named[step]
        assert slow["ranks"] == [1] and slow["ratio"] > 1.3 and slow["intervals"] == step, slow
    # 4 microbatches per rank and step, each forward pass 0.2 CPU-seconds longer on rank 1
    assert records[-1]["compute_s_max"] > 4 * 0.2
    events = [e for e in run.events() if e.get("event") == "straggler"]
    assert len(events) == 1 and events[0]["ranks"] == [1] and events[0]["step"] == 2
    # no batch shell to requeue without the node: named only, the run finishes
    assert run.ledger() == [] or run.ledger()[-1]["exit_reason"] == "finished"
