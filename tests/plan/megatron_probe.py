"""Build the real megatron-core model, DDP and optimizer on CPU and measure what they allocate.

Used two ways: imported by the single-process tests (world size 1), and run as a script under
``torch.distributed.run`` for layouts that need several ranks::

    python -m torch.distributed.run --nproc-per-node 4 tests/plan/megatron_probe.py CASES OUT

CASES is a JSON list of {"name", "job" (a job mapping), "tp", "pp", "vpp", "measure_activations"};
every rank writes its measurements to OUT.<rank>.json.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref

from hpctrain.runtime import cpu_shim

cpu_shim.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.module import Float16Module  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from hpctrain.config import job_from_mapping  # noqa: E402
from hpctrain.flops import padded_vocab_size  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def init_process_group() -> None:
    if dist.is_initialized():
        return
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(29500 + os.getpid() % 2000))
    dist.init_process_group("gloo")


def transformer_config(job, tp: int, pp: int, vpp: int | None) -> TransformerConfig:
    m, t = job.model, job.train
    dtype = DTYPES[t.precision]
    return TransformerConfig(
        num_layers=m.num_layers, hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
        ffn_hidden_size=m.ffn_hidden_size, kv_channels=m.kv_channels,
        add_bias_linear=m.add_bias_linear, normalization=m.normalization,
        gated_linear_unit=m.activation == "swiglu",
        activation_func=F.silu if m.activation == "swiglu" else F.gelu,
        hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=t.precision == "bf16",
        fp16=t.precision == "fp16", use_cpu_initialization=True,
        recompute_granularity=t.recompute_granularity,
        recompute_method=t.recompute_method if t.recompute_granularity == "full" else None,
        recompute_num_layers=t.recompute_num_layers if t.recompute_granularity == "full" else None,
    )


def build(job, tp: int, pp: int, vpp: int | None):
    """Model chunks (DDP-wrapped) and the optimizer, as a training run builds them."""
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tp, pp, vpp)
    model_parallel_cuda_manual_seed(job.train.seed)
    config = transformer_config(job, tp, pp, vpp)
    m = job.model
    spec = get_gpt_layer_local_spec(normalization=m.normalization)
    vocab = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    chunks = []
    for j in range(vpp or 1):
        vp = j if vpp else None
        model = GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=vocab,
            max_sequence_length=m.max_position_embeddings or m.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
            position_embedding_type=m.position_embedding_type, vp_stage=vp)
        if job.train.precision != "fp32":
            model = Float16Module(config, model)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=job.train.grad_reduce_in_fp32,
            use_distributed_optimizer=job.parallel.use_distributed_optimizer)
        chunks.append(DistributedDataParallel(config, ddp_config, model,
                                              disable_bucketing=j > 0))
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-4, bf16=job.train.precision == "bf16",
        fp16=job.train.precision == "fp16",
        use_distributed_optimizer=job.parallel.use_distributed_optimizer), chunks)
    return chunks, optimizer


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def measure_state(chunks, optimizer) -> dict:
    """Parameters, weight/gradient/optimizer bytes this rank allocated, after one real step."""
    for c in chunks:
        c.zero_grad_buffer()
    optimizer.zero_grad()
    optimizer.step()   # zero gradients: Adam still creates its moments
    param_storages: dict[int, int] = {}
    params = 0
    names = []
    for c in chunks:
        for name, p in c.named_parameters():
            params += p.numel()
            names.append((name, p.numel()))
            ptr, nbytes = _storage(p)
            param_storages[ptr] = nbytes
    grad_bytes = sum(b.grad_data.nbytes for c in chunks for b in c.buffers)
    grad_storages = {_storage(b.grad_data)[0] for c in chunks for b in c.buffers}
    opt_storages: dict[int, int] = {}
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    for o in inner:
        torch_opt = o.optimizer
        for group in torch_opt.param_groups:
            for p in group["params"]:
                tensors = [p] + [v for v in torch_opt.state[p].values()
                                 if torch.is_tensor(v) and v.dim() > 0]
                if p.grad is not None:
                    tensors.append(p.grad)
                for t in tensors:
                    ptr, nbytes = _storage(t)
                    if ptr not in param_storages and ptr not in grad_storages:
                        opt_storages[ptr] = nbytes
    return {"parameters": params, "names": names, "weight_bytes": sum(param_storages.values()),
            "grad_bytes": grad_bytes, "optimizer_bytes": sum(opt_storages.values())}


class _Saved:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class SavedActivations:
    """Bytes of the tensors the autograd graph keeps for backward: distinct storages saved by
    graph nodes that are still alive after the forward (parameters, gradient buffers and the
    inputs excluded). A tensor saved by a graph that was already thrown away (the inside of a
    recomputed checkpoint) is not counted."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.saved: list[tuple[weakref.ref, int, int]] = []

    def pack(self, t: torch.Tensor):
        holder = _Saved(t)
        ptr, nbytes = _storage(t)
        if ptr and ptr not in self.exclude:
            self.saved.append((weakref.ref(holder), ptr, nbytes))
        return holder

    @staticmethod
    def unpack(holder: _Saved) -> torch.Tensor:
        return holder.tensor

    def total(self) -> int:
        gc.collect()
        alive = {ptr: nbytes for ref, ptr, nbytes in self.saved if ref() is not None}
        return sum(alive.values())


def measure_activations(chunks, job, micro_batch_size: int) -> dict:
    """Forward one microbatch with saved-tensor hooks, then backward (PP = 1 only)."""
    (model,) = chunks
    s = job.model.seq_length
    torch.manual_seed(0)
    tokens = torch.randint(0, job.model.vocab_size, (micro_batch_size, s))
    position_ids = torch.arange(s).unsqueeze(0).expand(micro_batch_size, -1)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    exclude = {_storage(p)[0] for p in model.parameters()}
    exclude |= {_storage(b.grad_data)[0] for b in model.buffers}
    exclude |= {_storage(x)[0] for x in (tokens, position_ids, mask)}
    saved = SavedActivations(exclude)
    model.zero_grad_buffer()
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        loss = model(tokens, position_ids, mask, labels=tokens)
    stored = saved.total()
    loss.float().sum().backward()
    return {"activation_bytes": stored}


def run_cases(cases: list[dict]) -> list[dict]:
    init_process_group()
    out = []
    for case in cases:
        job = job_from_mapping(case["job"], case["name"])
        chunks, optimizer = build(job, case["tp"], case["pp"], case.get("vpp"))
        result = {"name": case["name"], "rank": dist.get_rank(),
                  "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
                  "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
                  "dp_rank": parallel_state.get_data_parallel_rank(),
                  "dp": parallel_state.get_data_parallel_world_size()}
        if case.get("measure_activations"):
            result.update(measure_activations(chunks, job, job.batch.micro_batch_size))
        result.update(measure_state(chunks, optimizer))
        out.append(result)
    return out


if __name__ == "__main__":
    cases_path, out_prefix = sys.argv[1], sys.argv[2]
    with open(cases_path) as f:
        results = run_cases(json.load(f))
    with open(f"{out_prefix}.{dist.get_rank()}.json", "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
