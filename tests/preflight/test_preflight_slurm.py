"""`hpctrain preflight --profile dev-slurm` through the real dev Slurm cluster (2 nodes x 2 tasks)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import hpctrain


@pytest.mark.slurm
def test_preflight_job_on_dev_cluster_passes(slurm_cluster, tmp_path):
    out = hpctrain("preflight", "--profile", "dev-slurm", "--runs-dir", str(tmp_path), "--json",
                   "--wait", "240", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["passed"] and len(report["nodes"]) == 2 and report["world_size"] == 4
    assert [s["size"] for s in report["sweep"]] == [262144, 1048576, 4194304]
    assert {r["node"] for r in report["checks"] if r["check"] == "collective.intra_node"} == \
        set(report["nodes"])


@pytest.mark.slurm
def test_preflight_job_on_dev_cluster_locates_a_slow_node(slurm_cluster, tmp_path):
    out = hpctrain("preflight", "--profile", "dev-slurm", "--runs-dir", str(tmp_path), "--wait", "240",
                   env={"HPCTRAIN_TEST_HOOKS": "1", "HPCTRAIN_TEST_PREFLIGHT_DELAY": "n2:0.3"},
                   timeout=300)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "FAIL  collective.intra_node" in out.stdout
    assert "bad nodes: n2" in out.stdout
    report = json.loads(next(tmp_path.glob("preflight-dev-slurm-*/preflight/report-*.json")).read_text())
    assert report["bad_nodes"] == ["n2"]
