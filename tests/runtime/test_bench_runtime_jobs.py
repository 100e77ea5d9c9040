"""tools/bench_runtime's jobs stay valid as the example they start from grows (a validation
split added to examples/tiny.yaml once made every benchmark run refuse its job): both sides
train the same valid job, with nothing but the step in it."""

from __future__ import annotations

from hpctrain.config import job_from_mapping, profile_from_mapping
from tests.conftest import tool_module


def test_the_benchmark_job_is_valid_and_times_the_step_alone():
    bench = tool_module("bench_runtime")
    job = job_from_mapping(bench.bench_job("/data/kjv_byte", 60), "bench")
    assert job.train.steps == 60 and job.train.log_interval == bench.LOG_INTERVAL
    assert job.train.eval_interval is None and not job.train.eval_at_end
    assert job.checkpoint.interval_steps == 0 and not job.checkpoint.save_at_end
    profile = profile_from_mapping(bench.profile(4), "p.yaml", "p")
    assert profile.slurm.gpus_per_node == 4
