"""The local executor leaves the machine's GPUs visible to the ranks, as Slurm would: submitit's
LocalExecutor sets CUDA_VISIBLE_DEVICES from gpus_per_node, which hid every GPU ("") from a
local GPU profile's ranks (found on an H100: preflight's NCCL group saw no CUDA GPU)."""

from __future__ import annotations

import pytest

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.submission import prepare_run, submit_function
from tests.conftest import REPO
from tests.scheduler import tasks


@pytest.mark.parametrize("visible", [None, "2,3"])
def test_the_ranks_see_the_machines_gpus(tmp_path, monkeypatch, visible):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("local"))
    run = prepare_run(r, tmp_path / "runs")
    sub = submit_function(run, r.profile, tasks.cuda_visible_devices, resolved=r)
    results = sub.job.results()
    assert len(results) == r.profile.slurm.gpus_per_node
    assert set(results) == {visible}
