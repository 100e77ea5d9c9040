"""hpctrain.runtime.gloo_groups: a CPU rank's gloo groups share one gloo device (one event
loop thread, not one per group), and stay torch's ProcessGroupGloo for everything that checks
(group timeouts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("gloo_groups_probe.py")


def _probe(mode: str) -> dict:
    proc = subprocess.run([sys.executable, str(PROBE), mode], capture_output=True, text=True,
                          timeout=300, env={"PYTHONWARNINGS": "ignore", "PATH": "/usr/bin:/bin",
                                            "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_groups_share_one_device_and_stay_gloo_groups():
    own, shared = _probe("own"), _probe("share")
    # torch's default: a device, and so an event loop thread, per group (25 groups here)
    assert own["threads"] - shared["threads"] >= 20, (own["threads"], shared["threads"])
    for r in (own, shared):
        assert r["sums"] == [[1.0, 1.0]] * 24
        assert r["is_gloo"] and not r["warnings"], r   # _set_pg_timeout saw gloo groups
