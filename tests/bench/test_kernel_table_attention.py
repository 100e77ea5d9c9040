"""The kernel table's attention rows for hpctrain's torch attention (the local spec without
Transformer Engine), measured through that module with one torch kernel allowed at a time: a
kernel this machine cannot run is a reason in the table, not a failed measurement."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpctrain.config.kernel_table import load_table
from tests.conftest import REPO

POINTS = [dict(batch=2, heads=4, kv_heads=4, seq=s, head_dim=16) for s in (32, 64)]


@pytest.mark.megatron
def test_each_torch_kernel_is_measured_alone_or_said_why_not(tmp_path):
    spec = {"device": "cpu", "dtype": "float32", "grid": [32, 64], "attention": POINTS,
            "backends": ["local", "torch-flash", "torch-cudnn"], "tool": "test",
            "host_kinds": []}     # the host's part has its own test (test_plan_host_issue)
    out = tmp_path / "table.json"
    proc = subprocess.run([sys.executable, "-m", "hpctrain.bench.kernels", "table",
                           json.dumps(spec), str(out)], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {(a["backend"], a["seq"]): a for a in data["attention"]}
    # megatron's unfused attention and torch's CPU flash kernel: every point, both directions
    assert set(rows) == {(b, p["seq"]) for b in ("local", "torch-flash") for p in POINTS}
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in rows.values())
    # cuDNN's kernel has no CPU implementation: its reason is recorded, nothing is made up
    (why,) = data["measured"]["attention_not_measured"]
    assert why.startswith("torch-cudnn: ") and len(why) > len("torch-cudnn: ")
    # the table is one the planner reads, and it prices the local spec's fused attention
    table = load_table(out)
    assert table.attention_seconds("torch-flash", 2, 4, 64, 16) == pytest.approx(
        (rows[("torch-flash", 64)]["forward_s"], rows[("torch-flash", 64)]["backward_s"]))
    assert table.attention_seconds("torch-cudnn", 2, 4, 64, 16) is None
