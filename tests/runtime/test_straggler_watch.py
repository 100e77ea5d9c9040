"""The straggler watch inside the ranks (:mod:`hpctrain.runtime.straggler_timing`): three real
gloo processes on three "nodes", one computing slower on purpose (its CPU time, not the
machine's speed). Every rank must reach the same decision from the one all-gather, rank 0
alone records it, and a node costs the run one stop only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("straggler_watch_probe.py")
REPO = Path(__file__).resolve().parents[2]


def _watch(tmp_path, may_exclude: bool, excluded: str = "") -> tuple[list, object]:
    from hpctrain.record.folder import RunFolder
    run = RunFolder(tmp_path / "run")
    run.path.mkdir(parents=True)
    store = tmp_path / "store"
    procs = [subprocess.Popen(
        [sys.executable, str(PROBE), str(r), str(store), str(run.path),
         "1" if may_exclude else "0", excluded],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
             "PYTHONPATH": str(REPO)}) for r in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs], run


@pytest.mark.parametrize("may_exclude", [True, False])
def test_every_rank_names_the_slow_node_and_rank_0_records_it_once(tmp_path, may_exclude):
    ranks, run = _watch(tmp_path, may_exclude)
    assert ranks[0] == ranks[1] == ranks[2]              # one decision, on every rank
    decisions = ranks[0]
    assert [d["step"] for d in decisions] == [1, 3, 4, 6]
    for d in decisions:
        seconds = d["compute_s"]
        assert len(seconds) == 3 and seconds[2] > 1.5 * max(seconds[:2])
        # per step (its own 5 ms and the 50 ms burn, CPU time), not the interval's sum
        assert 0.055 <= seconds[2] < 0.1
        assert d["tflops"] is False      # a CPU's time is no measure of GPU FLOP/s
    # slow in every interval, named once slow WINDOW (2) intervals in a row
    assert decisions[0]["named"] == [] and decisions[0]["exclude"] is None
    assert [d["named"] for d in decisions[1:]] == [[["node-2", [2], n]] for n in (2, 3, 4)]
    assert [d["exclude"] for d in decisions[1:]] == (["node-2"] * 3 if may_exclude
                                                     else [None] * 3)
    events = [e for e in run.events() if e["event"] == "straggler"]
    assert [(e["step"], e["node"], e["attempt"], e["intervals"]) for e in events] == \
        [(3, "node-2", 2, 2)]                            # when it was first named, by rank 0


def test_a_node_the_run_already_stopped_for_is_named_but_not_excluded_again(tmp_path):
    ranks, _ = _watch(tmp_path, may_exclude=True, excluded="node-2")
    assert ranks[0] == ranks[2]
    assert [d["named"][0][0] for d in ranks[0][1:]] == ["node-2"] * 3
    assert all(d["exclude"] is None for d in ranks[0])
