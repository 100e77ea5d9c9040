"""train.profile_step: one step of a real run under torch.profiler, summarised in the
attempt's folder on every rank (rank 0's whole trace beside it), said in rank 0's log; the
run itself trains on unchanged. A step that never runs is refused when the job is read."""

from __future__ import annotations

import gzip
import json

import pytest

from hpctrain.config import job_from_mapping
from hpctrain.errors import ConfigError
from tests.runtime.helpers import job_mapping, losses


@pytest.mark.megatron
def test_the_profiled_step_is_summarised_on_every_rank_and_the_run_trains_on(ws):
    run, res = ws.train("profiled", "dp2_zero1", steps=4, train={"profile_step": 3})
    folder = run.attempt_dir(1)
    for rank in (0, 1):
        report = json.loads((folder / f"profile-step-3-rank-{rank}.json").read_text())
        # what the host issued happened within the step; the ops are the step's own
        assert 0 < report["issued_s"] <= report["step_s"]
        assert report["host_ops_s"] > 0 and len(report["top_host_ops"]) == 25
        names = {o["name"] for o in report["top_host_ops"]}
        assert any(n.startswith("aten::") for n in names), names
        assert report["gpu_kernels_s"] == 0.0          # no GPU here: no kernel time made up
    # rank 0 alone writes the whole trace, readable as Chrome's trace format
    with gzip.open(folder / "profile-step-3-rank-0.trace.json.gz", "rt") as f:
        assert json.load(f)["traceEvents"]
    assert not (folder / "profile-step-3-rank-1.trace.json.gz").exists()
    assert "profile of step 3: forward and backward issued after" in res.output(0)
    # the profiler watched, it did not change the training: every step ran, with a loss
    assert sorted(losses(run)) == [1, 2, 3, 4]


def test_a_profile_step_after_the_last_step_is_refused_by_name():
    job = job_mapping("/data/kjv", steps=4, train={"profile_step": 5})
    with pytest.raises(ConfigError) as e:
        job_from_mapping(job, "job.yaml")
    assert "train.profile_step" in str(e.value) and "after the last step" in str(e.value)
    assert job_from_mapping(job_mapping("/data/kjv", steps=5, train={"profile_step": 5}),
                            "job.yaml").train.profile_step == 5


@pytest.mark.megatron
def test_a_profile_that_cannot_be_written_is_a_warning_and_the_run_trains_on(ws):
    """The summary's path taken by a folder: rank 0 says so in its log, the step counts, and
    training goes on to the end (a diagnostic never stops a run)."""
    from tests.launch import launch
    from tests.runtime.conftest import _explain
    run = ws.new_run("profile-unwritable", "single", steps=4, train={"profile_step": 2})
    (run.attempt_dir(1) / "profile-step-2-rank-0.json").mkdir(parents=True)
    res = launch(run.path, 1)
    assert res.codes == [0], _explain(res)
    assert "step 2: the profile could not be made or written" in res.output(0)
    assert sorted(losses(run)) == [1, 2, 3, 4]
