"""The planner against the real megatron-core objects on CPU, world size 1.

Parameters (names, order, counts), weight/gradient-buffer/optimizer bytes and the activations
the autograd graph keeps must equal what megatron-core allocates; the peak of a whole
forward + backward must stay under the planned activations (stored + backward working set).
Multi-rank layouts (TP, PP, VPP, DP sharding) are in test_plan_real_megatron_multi.py. The
measurements run in one process of their own (megatron_probe.py), never in the test runner.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plan_jobs import TINY_GPT, TINY_LLAMA, job_mapping, make_job

from hpctrain.config import Layout
from hpctrain.identity import free_port
from hpctrain.model_shape import ModelShape, chunk_parameters, count_parameters, pipeline_chunks
from hpctrain.planner.activations import (CPU_KERNELS, LOSS_BACKWARD_BYTES_PER_TOKEN,
                                       stage_activations)
from hpctrain.planner.layouts import Target, plan_layout
from hpctrain.planner.memory import state_bytes_per_pipeline_rank

PROBE = Path(__file__).with_name("megatron_probe.py")

NO_BIAS_GQA_LEARNED = dict(TINY_GPT, add_bias_linear=False, num_query_groups=1,
                           untie_embeddings_and_output_weights=True, vocab_size=300)
STATE_CASES = {
    "tied-gelu-bias fp32": (TINY_GPT, dict(precision="fp32")),
    "tied-gelu-bias bf16 dist-opt": (TINY_GPT, dict(parallel={"use_distributed_optimizer": True})),
    "untied-swiglu-gqa-rope bf16 16-bit grads": (TINY_LLAMA, dict(train={"grad_reduce_in_fp32": False})),
    "untied-swiglu-gqa-rope fp32 dist-opt": (TINY_LLAMA, dict(precision="fp32", parallel={
        "use_distributed_optimizer": True})),
    "untied-gelu-nobias-mqa-learned fp16 dist-opt": (NO_BIAS_GQA_LEARNED, dict(
        precision="fp16", parallel={"use_distributed_optimizer": True})),
}


def _strip(name: str) -> str:
    while name.startswith("module."):
        name = name[len("module."):]
    return name


@pytest.mark.parametrize("case", list(STATE_CASES))
def test_parameters_and_state_bytes_equal_what_megatron_allocates(measured, case):
    model, kwargs = STATE_CASES[case]
    job = make_job(model, **kwargs)
    real = measured[f"state {case}"]
    shape = ModelShape.from_job(job)
    (chunk,), = pipeline_chunks(shape.num_layers, 1, None)
    planned = [(p.name, p.numel) for p in chunk_parameters(shape, 1, 1, chunk)]
    assert [(_strip(n), k) for n, k in real["names"]] == planned
    assert count_parameters(shape).total == real["parameters"]
    t = job.train
    (state,) = state_bytes_per_pipeline_rank(
        shape, tp=1, pp=1, vpp=None, dp=1, precision=t.precision,
        grad_reduce_in_fp32=t.grad_reduce_in_fp32,
        distributed_optimizer=job.parallel.use_distributed_optimizer)
    assert (state.weights, state.gradients, state.optimizer) == (
        real["weight_bytes"], real["grad_bytes"], real["optimizer_bytes"])
    # 16-bit gradient buffers: the optimizer's fp32 copy exists from the step to the next
    # zero_grad only (none with an fp32 buffer: .float() is the buffer itself)
    assert state.main_grads == real["main_grad_bytes"]
    assert (state.main_grads > 0) == (t.precision != "fp32" and not t.grad_reduce_in_fp32)
    assert real["main_grads_before_step"] == 0 and real["main_grad_bytes_after_zero_grad"] == 0


ACTIVATION_MODELS = {
    "gpt": TINY_GPT,
    "gpt-dropout": dict(TINY_GPT, hidden_dropout=0.1, attention_dropout=0.1),
    "llama-gqa-rope-swiglu": TINY_LLAMA,
    "gpt-learned-mqa": dict(NO_BIAS_GQA_LEARNED, seq_length=48),
    # torch's fused attention (scaled_dot_product_attention) in the local spec: no scores
    "gpt fused": dict(TINY_GPT, attention_backend="auto"),
    "llama-gqa-rope-swiglu fused": dict(TINY_LLAMA, attention_backend="auto"),
    "gpt-learned-mqa fused": dict(NO_BIAS_GQA_LEARNED, seq_length=48, attention_backend="auto"),
}
RECOMPUTE = {"none": {}, "selective": {"recompute_granularity": "selective"},
             "full-uniform-2": {"recompute_granularity": "full", "recompute_num_layers": 2},
             "full-block-1": {"recompute_granularity": "full", "recompute_method": "block"}}


def planned_activations(job, micro_batch_size):
    t = job.train
    act_bytes = {"fp32": 4, "bf16": 2, "fp16": 2}[t.precision]
    # the CPU runs the job's attention: megatron's unfused attention keeps the scores, torch's
    # CPU flash kernel does not (with attention dropout torch's math kernel runs, which does)
    shape = ModelShape.from_job(job)
    shape = dataclasses.replace(shape, attention_stores_scores=shape.attention_stores_scores
                                or shape.attention_dropout > 0)
    return stage_activations(shape, tp=1, pp=1, vpp=None, pp_rank=0,
                             micro_batch_size=micro_batch_size, num_microbatches=1,
                             sequence_parallel=False, recompute=t.recompute_granularity,
                             recompute_method=t.recompute_method,
                             recompute_num_layers=t.recompute_num_layers,
                             act_bytes=act_bytes, kernels=CPU_KERNELS)


# 16-bit training, as on GPUs: megatron's torch softmax keeps fp32 probabilities beside their
# 16-bit cast, and torch's composite RMSNorm keeps fp32 copies (the CPU's kernels; CUDA fuses it)
ACTIVATION_CASES = [("fp32", r) for r in RECOMPUTE] + [("bf16", r) for r in ("none", "selective")]


@pytest.mark.parametrize("precision, recompute", ACTIVATION_CASES)
@pytest.mark.parametrize("model", list(ACTIVATION_MODELS))
def test_stored_activations_equal_what_autograd_keeps(measured, model, precision, recompute):
    job = make_job(ACTIVATION_MODELS[model], precision=precision, mbs=2,
                   train=RECOMPUTE[recompute])
    real = measured[f"activations {precision} {model} {recompute}"]["activation_bytes"]
    planned = planned_activations(job, 2).stored
    if recompute == "selective":
        # the checkpoint of the attention core also keeps a few scalars (16 bytes seen)
        assert 0 <= real - planned <= 64
    else:
        assert planned == real


PEAK_SHAPES = {
    "gpt h256 s256": dict(num_layers=4, hidden_size=256, num_attention_heads=8, vocab_size=1000,
                          seq_length=256, attention_backend="local"),
    "llama h256 s256": dict(TINY_LLAMA, hidden_size=256, num_attention_heads=8,
                            num_query_groups=2, ffn_hidden_size=704, vocab_size=1000,
                            seq_length=256),
}


@pytest.mark.parametrize("recompute", ["none", "selective", "full-uniform-2"])
@pytest.mark.parametrize("name", list(PEAK_SHAPES))
def test_forward_backward_peak_stays_within_the_planned_activations(measured, name, recompute):
    job = make_job(PEAK_SHAPES[name], precision="fp32", mbs=2, train=RECOMPUTE[recompute])
    peak = measured[f"peak {name} {recompute}"]["peak_bytes"]
    planned = plan_layout(job, Layout(1, 1, None, 1, 2, 2),
                          Target(1, 1, None, Target.from_profile(None, 1).hardware, "cpu"),
                          sequence_parallel=False, recompute=job.train.recompute_granularity)
    act = planned.activations
    print(f"\n{name} {recompute}: stored {act.stored / 2**20:.2f} MiB, planned "
          f"{act.total / 2**20:.2f} MiB, measured peak {peak / 2**20:.2f} MiB "
          f"({(act.total - peak) / peak:+.0%})")
    assert act.stored < peak <= act.total <= 1.6 * peak


# a vocabulary large enough that the loss's backward is the peak: megatron's cross entropy
# returns the logits' gradient in its saved fp32 softmax (autograd casts it to 16 bits in bf16)
LOSS_PEAK = dict(PEAK_SHAPES["gpt h256 s256"], num_layers=2, vocab_size=16000)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_loss_backward_peak_is_planned_to_within_its_per_token_operands(measured, precision):
    job = make_job(LOSS_PEAK, precision=precision, mbs=2)
    peak = measured[f"loss peak {precision}"]["peak_bytes"]
    act = planned_activations(job, 2)
    logits = 256 * 2 * 16000 * 4
    assert act.output_layer > logits                    # the fp32 softmax, stored
    print(f"\nloss peak {precision}: planned {act.total} B, measured {peak} B")
    # exact up to the loss's per-token operands (bounded by LOSS_BACKWARD_BYTES_PER_TOKEN)
    assert peak <= act.total <= peak + 256 * 2 * LOSS_BACKWARD_BYTES_PER_TOKEN


def _cases() -> list[dict]:
    cases = [dict(name=f"state {case}", tp=1, pp=1, job=job_mapping(model, **kwargs))
             for case, (model, kwargs) in STATE_CASES.items()]
    cases += [dict(name=f"activations {precision} {model} {recompute}", tp=1, pp=1,
                   measure_state=False, measure_activations=True,
                   job=job_mapping(ACTIVATION_MODELS[model], precision=precision, mbs=2,
                                   train=RECOMPUTE[recompute]))
              for model in ACTIVATION_MODELS for precision, recompute in ACTIVATION_CASES]
    cases += [dict(name=f"peak {name} {recompute}", tp=1, pp=1, measure_state=False,
                   measure_peak=True,
                   job=job_mapping(PEAK_SHAPES[name], precision="fp32", mbs=2,
                                   train=RECOMPUTE[recompute]))
              for name in PEAK_SHAPES for recompute in ["none", "selective", "full-uniform-2"]]
    cases += [dict(name=f"loss peak {precision}", tp=1, pp=1, measure_state=False,
                   measure_peak=True, job=job_mapping(LOSS_PEAK, precision=precision, mbs=2))
              for precision in ("fp32", "bf16")]
    return cases


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, dict]:
    """Every case built and measured by real megatron-core in one process (world size 1)."""
    folder = tmp_path_factory.mktemp("probe1")
    (folder / "cases.json").write_text(json.dumps(_cases()))
    port = free_port("127.0.0.1")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    proc = subprocess.run([sys.executable, str(PROBE), str(folder / "cases.json"),
                           str(folder / "out")], capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["name"]: r for r in json.loads((folder / "out.0.json").read_text())}
