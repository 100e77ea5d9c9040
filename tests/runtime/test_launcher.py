"""The launchers' promise that ranks never outlive the process that launched them: the tests'
(``tests/launch.py``, forked or exec'd ranks) and the tools' (``hpctrain.scheduler.local.launch``,
which ``tools/gpu_check`` and the benchmarks use).

A test killed by a timeout must not leave ranks behind: a rank that never finishes would spin
for hours, slowing every test after it. A tool stopped with Ctrl-C must not leave ranks holding
a GPU: they run in sessions of their own, which the terminal's signal does not reach."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.launch import REPO, _alive

LAUNCHER = """
import json, sys, time
sys.path.insert(0, {repo!r})
if {mode!r} == "tools":
    from hpctrain.scheduler.local.launch import start_ranks
    ranks = start_ranks([sys.executable, "-m", "tests.runtime.sleep_probe", "3600"],
                        {run_dir!r}, ranks_per_node=2, env={{"PYTHONPATH": {repo!r}}})
    pids = [p.pid for p in ranks.procs]
else:
    from tests.launch import Launch
    launch = Launch({run_dir!r}, 2, mode={mode!r}, module="tests.runtime.sleep_probe",
                    args=["3600"])
    pids = launch.pids(timeout=600)      # the fork server imports megatron-core first
print(json.dumps(pids), flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("mode", ["fork", "exec", "tools"])
def test_ranks_die_when_the_launching_process_is_killed(tmp_path, mode):
    owner = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER.format(repo=str(REPO), run_dir=str(tmp_path), mode=mode)],
        stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(owner.stdout.readline())
        assert len(pids) == 2 and all(_alive(pid) for pid in pids), pids
    finally:
        owner.kill()
        owner.wait()
    end = time.time() + 120
    while any(_alive(pid) for pid in pids) and time.time() < end:
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)], f"ranks outlived their launcher ({mode})"


def test_a_zombie_counts_as_gone_and_a_running_process_as_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    end = time.time() + 60
    while _alive(child.pid) and time.time() < end:      # exited, not yet reaped: a zombie
        time.sleep(0.05)
    with open(f"/proc/{child.pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] == "Z"
    assert not _alive(child.pid)
    child.wait()
    assert not _alive(child.pid)
    assert _alive(subprocess.os.getpid())
