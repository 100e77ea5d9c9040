"""The local launcher's ``--kill-on-bad-exit``: a crash takes the other ranks down, ranks that
exit on purpose (preempted: 75) one after the other do not (real processes)."""

from __future__ import annotations

import sys
from pathlib import Path

from hpctrain import exit_codes
from hpctrain.scheduler.local.launch import start_ranks

# rank 0 exits at once; rank 1 waits until rank 0 is gone, then for ``LATER`` seconds more
RANK = """
import os, sys, time
rank = int(os.environ["RANK"])
done = os.path.join(sys.argv[1], "rank-0-exited")
if rank == 0:
    open(done, "w").close()
    sys.exit(int(sys.argv[2]))
while not os.path.exists(done):
    time.sleep(0.02)
time.sleep(float(sys.argv[3]))
sys.exit(int(sys.argv[4]))
"""


def _launch(tmp_path: Path, first: int, later_s: float, second: int) -> list[int]:
    argv = [sys.executable, "-c", RANK, str(tmp_path), str(first), str(later_s), str(second)]
    return start_ranks(argv, tmp_path / "logs", ranks_per_node=2).wait(timeout=600)


def test_ranks_preempted_one_after_the_other_both_keep_their_code(tmp_path):
    # rank 1 saves for a while after rank 0 exits: well past the grace a crash gets, and it
    # must still finish its save and exit 75 on its own
    assert _launch(tmp_path, exit_codes.PREEMPTED, 3.0, exit_codes.PREEMPTED) == [75, 75]


def test_a_crash_takes_the_other_ranks_down(tmp_path):
    codes = _launch(tmp_path, exit_codes.FAILED, 600.0, exit_codes.FINISHED)
    assert codes[0] == exit_codes.FAILED and codes[1] < 0     # killed, not left to hang
