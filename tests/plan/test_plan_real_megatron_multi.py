"""The planner against real megatron-core on 4 CPU ranks: TP, PP, VPP and DP sharding.

One launch of 4 processes builds several layouts in turn (parallel state is torn down and
rebuilt between them) and reports, per rank, the parameters it holds, the weight, gradient
buffer and optimizer bytes it allocated, and (PP = 1 layouts) the activations its autograd
graph keeps. Every number must equal the planner's for that rank's pipeline stage and DP rank.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plan_jobs import TINY_GPT, TINY_LLAMA, job_mapping

from hpctrain.config import job_from_mapping
from hpctrain.identity import free_port
from hpctrain.model_shape import ModelShape, count_parameters
from hpctrain.planner.activations import CPU_KERNELS, stage_activations
from hpctrain.planner.memory import state_bytes_per_pipeline_rank
from hpctrain.planner.save_memory import buffer_shapes, gather_replay

PROBE = Path(__file__).with_name("megatron_probe.py")
SAVE_FORMATS = ["fully_reshardable", "dp_reshardable"]
WIDE_LLAMA = dict(TINY_LLAMA, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=128,
                  vocab_size=300)

CASES = [
    # tied embedding split over two stages (the last keeps a copy), biases, learned positions
    dict(name="tp2-pp2 fp32 tied gelu", tp=2, pp=2,
         job=job_mapping(TINY_GPT, precision="fp32", mbs=2, gbs=4)),
    # interleaved 1F1B chunks, the tied copies in their own buckets, ZeRO-1 over 2 DP ranks
    # (and a checkpoint save's optimizer state: two buffers per rank, the tied copy's bucket)
    dict(name="pp2-vpp2-dp2 bf16 dist-opt tied swiglu gqa rope", tp=1, pp=2, vpp=2,
         measure_save=SAVE_FORMATS,
         job=job_mapping(dict(TINY_LLAMA, untie_embeddings_and_output_weights=False),
                         mbs=1, gbs=4, parallel={"use_distributed_optimizer": True})),
    # column- and row-parallel biases, 16-bit gradients (fp32 copies at the step), ZeRO-1
    dict(name="tp2-dp2 bf16 dist-opt 16-bit grads untied gqa bias", tp=2, pp=1,
         measure_save=SAVE_FORMATS,
         job=job_mapping(dict(TINY_GPT, num_query_groups=2, untie_embeddings_and_output_weights=True),
                         mbs=1, gbs=2, parallel={"use_distributed_optimizer": True},
                         train={"grad_reduce_in_fp32": False})),
    # activations split over 4 tensor-parallel ranks
    dict(name="tp4 fp32 swiglu gqa rope activations", tp=4, pp=1, measure_activations=True,
         job=job_mapping(WIDE_LLAMA, precision="fp32", mbs=2, gbs=2)),
    dict(name="tp2-dp2 fp32 gelu dropout activations", tp=2, pp=1, measure_activations=True,
         job=job_mapping(dict(TINY_GPT, hidden_dropout=0.1, attention_dropout=0.1),
                         precision="fp32", mbs=2, gbs=4)),
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("probe")
    (folder / "cases.json").write_text(json.dumps(CASES))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port("127.0.0.1")), str(PROBE),
         str(folder / "cases.json"), str(folder / "out")],
        capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = []
    for rank in range(4):
        results += json.loads((folder / f"out.{rank}.json").read_text())
    return results


@pytest.mark.megatron
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_every_rank_holds_what_the_planner_says(measured, case):
    job = job_from_mapping(case["job"], case["name"])
    tp, pp, vpp = case["tp"], case["pp"], case.get("vpp")
    shape = ModelShape.from_job(job)
    count = count_parameters(shape, tp, pp, vpp)
    ranks = [r for r in measured if r["name"] == case["name"]]
    assert len(ranks) == 4
    assert count.most_loaded_rank == max(r["parameters"] for r in ranks)
    t = job.train
    for r in ranks:
        where = f"rank {r['rank']} (pp {r['pp_rank']}, dp {r['dp_rank']})"
        assert count.per_pipeline_rank[r["pp_rank"]] == r["parameters"], where
        state = state_bytes_per_pipeline_rank(
            shape, tp=tp, pp=pp, vpp=vpp, dp=r["dp"], precision=t.precision,
            grad_reduce_in_fp32=t.grad_reduce_in_fp32,
            distributed_optimizer=job.parallel.use_distributed_optimizer,
            dp_rank=r["dp_rank"])[r["pp_rank"]]
        assert (state.weights, state.gradients, state.optimizer) == (
            r["weight_bytes"], r["grad_bytes"], r["optimizer_bytes"]), where
        # the fp32 main gradients: only from the step to the next zero_grad
        assert state.main_grads == r["main_grad_bytes"], where
        assert r["main_grads_before_step"] == 0 and r["main_grad_bytes_after_zero_grad"] == 0
        if case.get("measure_activations"):
            cpu_shape = dataclasses.replace(shape, attention_stores_scores=True)
            planned = stage_activations(cpu_shape, tp=tp, pp=1, vpp=None, pp_rank=0,
                                        micro_batch_size=job.batch.micro_batch_size,
                                        num_microbatches=1, sequence_parallel=False,
                                        recompute=None, act_bytes=4, kernels=CPU_KERNELS)
            assert planned.stored == r["activation_bytes"], where


@pytest.mark.megatron
@pytest.mark.parametrize("case", [c for c in CASES if c.get("measure_save")],
                         ids=[c["name"] for c in CASES if c.get("measure_save")])
def test_checkpoint_save_memory_equals_what_the_save_allocates(measured, case):
    """Building a save's optimizer state through the runtime's own code (megatron-core's
    gather plus hpctrain's re-padding): the state it keeps and the peak of everything it
    allocated on the way equal the planner's replay, on every rank (on CPU the GPU's receive
    buffers are host tensors, which the replay's CPU mode accounts for)."""
    job = job_from_mapping(case["job"], case["name"])
    shape = ModelShape.from_job(job)
    for r in (r for r in measured if r["name"] == case["name"]):
        where = f"rank {r['rank']} (pp {r['pp_rank']}, dp {r['dp_rank']})"
        buffers = buffer_shapes(shape, case["tp"], case["pp"], case.get("vpp"), r["dp"])
        peak, gpu, held = gather_replay(buffers[r["pp_rank"]], r["dp"], device="cpu")
        full = r["save"]["fully_reshardable"]
        assert full["held_bytes"] == held, where
        # the peak is exact except when gloo's worker thread still holds one collective's
        # buffers as the next op is sampled (a race between threads, about one run in three):
        # at most a bucket's fp32 and 16-bit copies more
        largest = max(size for b in buffers[r["pp_rank"]] for size, _ in b.buckets)
        assert peak <= full["peak_bytes"] <= peak + 8 * largest, where
        assert held == 12 * sum(b.numel for b in buffers[r["pp_rank"]])     # 3 fp32 per element
        assert r["save"]["dp_reshardable"] == {"held_bytes": 0, "peak_bytes": 0}, where
