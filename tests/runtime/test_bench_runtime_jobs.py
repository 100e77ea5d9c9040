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


def test_the_host_bound_job_is_valid_on_one_rank_with_many_small_layers():
    bench = tool_module("bench_runtime")
    job = job_from_mapping(bench.bench_job("/data/kjv_byte", 60, host_bound=True), "bench")
    plain = job_from_mapping(bench.bench_job("/data/kjv_byte", 60), "bench")
    assert job.model.num_layers > plain.model.num_layers
    assert job.model.hidden_size < plain.model.hidden_size
    par = job.parallel
    assert (par.tensor_model_parallel_size, par.pipeline_model_parallel_size,
            par.virtual_pipeline_model_parallel_size) == (1, 1, None)
    assert job.batch.global_batch_size // job.batch.micro_batch_size == 8
    assert job.checkpoint.interval_steps == 0 and job.train.eval_interval is None
    unfused = job_from_mapping(bench.bench_job("/data/kjv_byte", 60, True, unfused=True), "b")
    assert unfused.model.attention_backend == "local" != job.model.attention_backend
