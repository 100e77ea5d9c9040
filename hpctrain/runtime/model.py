"""The GPT model, its DDP wrapper and optimizer, built from a job with megatron-core.

Two entry points other parts reuse (the planner measures real allocations with them):

* :func:`transformer_config` — megatron-core's ``TransformerConfig`` for a job on a layout;
* :func:`build_model_and_optimizer` — after ``parallel_state`` is initialized
  (:func:`initialize_parallel`): the model chunks (one per virtual stage) wrapped in
  megatron-core's ``DistributedDataParallel``, and the (distributed) optimizer.

Device policy: on a GPU the job's precision (bf16 or fp16 with fp32 main parameters) and the
job's ``model.transformer_impl`` (Transformer Engine's layer spec by default, no silent
fallback: ``hpctrain.runtime.layers``); on the CPU rehearsal fp32 and the local spec, with
fusions off (they need CUDA kernels). The caller logs what was chosen.
Imports torch and megatron: call only inside a rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model_shape import padded_vocab_size


@dataclass
class ModelAndOptimizer:
    model: list            # DDP-wrapped GPTModel chunks, one per virtual pipeline stage
    optimizer: object      # megatron-core MegatronOptimizer (Chained/Distributed/FP32/Float16)
    config: object         # TransformerConfig
    notes: list[str] = field(default_factory=list)  # what was adapted for this device
    layers: object = None  # runtime.layers.LayerImpl: layer spec, attention backend, fusions

    @property
    def modules(self) -> list:
        """The chunks inside DDP (GPTModel, or Float16Module around it with 16-bit params)."""
        return [m.module for m in self.model]


def compute_dtype(job, device: str):
    import torch
    if device != "cuda":
        return torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        job.train.precision]


def transformer_config(job, layout, device: str, notes: list[str] | None = None):
    """megatron-core ``TransformerConfig`` for ``job`` on ``layout`` (a config.Layout)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    from . import layers
    from .comm_overlap import overlap_p2p

    notes = notes if notes is not None else []
    m, t = job.model, job.train
    gpu = device == "cuda"
    dtype = compute_dtype(job, device)
    impl = layers.choose(job, device)   # raises, before anything is built, when TE is missing
    te = impl.name == layers.TRANSFORMER_ENGINE
    notes.extend(n for n in impl.notes if n not in notes)
    vpp = layout.virtual_pipeline_model_parallel_size
    sequence_parallel = bool(job.parallel.sequence_parallel and layout.tensor_model_parallel_size > 1)
    if sequence_parallel and not te:
        notes.append("sequence parallelism off: it needs Transformer Engine's norms (the local "
                     "layer spec uses torch norms); the math is the same without it")
        sequence_parallel = False
    swiglu = m.activation == "swiglu"
    backend = getattr(AttnBackend, impl.attention_backend)
    if impl.fusions.get("apply_rope_fusion"):
        from . import rope
        if rope.install() == "torch.compile":
            notes.append("RoPE fusion: megatron-core's RoPE compiled by torch.compile (no "
                         "Transformer Engine)")
    recompute = t.recompute_granularity
    kwargs = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
        ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size, kv_channels=m.kv_channels,
        hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
        init_method_std=m.init_method_std, layernorm_epsilon=m.layernorm_epsilon,
        normalization=m.normalization, add_bias_linear=m.add_bias_linear,
        gated_linear_unit=swiglu, activation_func=F.silu if swiglu else F.gelu,
        attention_backend=backend,
        tensor_model_parallel_size=layout.tensor_model_parallel_size,
        pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=vpp,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype, pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        # Weights drawn where they live (Megatron-LM's default): each TP rank draws its own
        # slice from the model-parallel RNG tracker, each pipeline stage from its own seed.
        use_cpu_initialization=False,
        # Megatron-LM: p2p overlap with the interleaved schedule, batched p2p otherwise
        overlap_p2p_comm=overlap_p2p(job, layout),
        batch_p2p_comm=not overlap_p2p(job, layout),
        transformer_impl=impl.name,
        # each fusion only where its kernel imports (layers.choose)
        gradient_accumulation_fusion=impl.fusions["gradient_accumulation_fusion"],
        # megatron refuses the gelu fusion without a bias to fuse
        bias_activation_fusion=impl.fusions["bias_activation_fusion"] and (swiglu or
                                                                           m.add_bias_linear),
        bias_dropout_fusion=impl.fusions["bias_dropout_fusion"],
        masked_softmax_fusion=impl.fusions["masked_softmax_fusion"],
        apply_rope_fusion=impl.fusions["apply_rope_fusion"], persist_layer_norm=False,
        cross_entropy_loss_fusion=impl.fusions.get("cross_entropy_loss_fusion", False),
        cross_entropy_fusion_impl="native",
        # Megatron-LM always: free each stage output's data once sent (its graph stays for
        # backward); on GPUs only, where NCCL keeps the memory until the send has run
        deallocate_pipeline_outputs=gpu and bool(getattr(job.parallel,
                                                         "deallocate_pipeline_outputs", True)),
        deterministic_mode=bool(getattr(t, "deterministic_mode", False)),
        recompute_granularity=recompute,
        recompute_method=t.recompute_method if recompute == "full" else None,
        recompute_num_layers=t.recompute_num_layers if recompute == "full" else None,
    )
    if not gpu and t.precision != "fp32":
        notes.append(f"precision fp32 on CPU (the job asks for {t.precision}, which needs a GPU)")
    return TransformerConfig(**kwargs)


def layer_spec(job, config, device: str):
    from . import layers
    return layers.layer_spec(job, layers.choose(job, device))


def stage_seed(seed: int, pp_rank: int) -> int:
    """Megatron-LM's ``_set_random_seed``: each pipeline stage draws from its own seed (with
    one seed, every stage would initialize its layers with the same weights)."""
    return seed + 100 * pp_rank


def initialize_parallel(layout, seed: int, timeout_minutes: int = 30) -> None:
    """megatron-core's parallel_state for ``layout`` and its RNG seeds, per pipeline stage
    (:func:`stage_seed`; the model-parallel tracker adds its per-TP-rank offset)."""
    import random

    import numpy as np
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tensor_model_parallel_size,
        pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=layout.virtual_pipeline_model_parallel_size,
        distributed_timeout_minutes=timeout_minutes)
    seed = stage_seed(seed, parallel_state.get_pipeline_model_parallel_rank())
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def build_model_chunks(job, layout, device: str, config, spec=None) -> list:
    """The GPTModel chunks this rank holds (one per virtual stage), on ``device``."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_model import GPTModel

    m = job.model
    spec = spec or layer_spec(job, config, device)
    vocab = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by,
                              layout.tensor_model_parallel_size)
    vpp = layout.virtual_pipeline_model_parallel_size

    def chunk(vp_stage):
        kw = dict(ignore_virtual=False, vp_stage=vp_stage) if vpp else {}
        model = GPTModel(
            config=config, transformer_layer_spec=spec, vocab_size=vocab,
            max_sequence_length=m.max_position_embeddings or m.seq_length,
            pre_process=ps.is_pipeline_first_stage(**kw), post_process=ps.is_pipeline_last_stage(**kw),
            share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
            position_embedding_type=m.position_embedding_type, rotary_base=m.rotary_base,
            vp_stage=vp_stage)
        if device == "cuda":
            model.cuda()
        return model

    return [chunk(i) for i in range(vpp)] if vpp else [chunk(None)]


def build_model_and_optimizer(job, layout, device: str) -> ModelAndOptimizer:
    """Model chunks + megatron DDP + optimizer (ZeRO-1 when ``use_distributed_optimizer``).

    Needs ``torch.distributed`` and :func:`initialize_parallel` done. The learning rate is set
    per step by the training loop (``hpctrain.runtime.lr_schedule``).
    """
    from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module

    from .comm_overlap import ddp_config as make_ddp_config, wire_schedule

    notes: list[str] = []
    config = transformer_config(job, layout, device, notes)
    chunks = build_model_chunks(job, layout, device, config)
    if config.bf16 or config.fp16:
        # 16-bit parameters: embed/emit in fp32 at the pipeline's ends, as Megatron-LM does
        chunks = [Float16Module(config, c) for c in chunks]
    t = job.train
    distopt = bool(job.parallel.use_distributed_optimizer)
    ddp_config = make_ddp_config(job, layout, device)
    # bucketing only for the first chunk: the others' reduction overlaps compute anyway
    model = [DistributedDataParallel(config, ddp_config, c, disable_bucketing=(i > 0))
             for i, c in enumerate(chunks)]
    for m in model:
        m.broadcast_params()
    opt_config = OptimizerConfig(
        optimizer="adam", lr=t.lr, min_lr=t.min_lr, weight_decay=t.weight_decay,
        adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2, adam_eps=t.adam_eps,
        clip_grad=t.clip_grad, bf16=config.bf16, fp16=config.fp16,
        params_dtype=config.params_dtype, use_distributed_optimizer=distopt,
        overlap_param_gather=ddp_config.overlap_param_gather, decoupled_weight_decay=True)
    optimizer = get_megatron_optimizer(opt_config, model)
    from .checkpoint.optimizer_step import use_fused_adam
    if getattr(t, "fused_adam", True) and use_fused_adam(optimizer):
        notes.append("Adam: torch's fused AdamW (one kernel per step, in place; its step "
                     "counts on the parameters' device)")
    wire_schedule(config, model, ddp_config)
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    from . import layers
    return ModelAndOptimizer(model=model, optimizer=optimizer, config=config, notes=notes,
                             layers=layers.choose(job, device))


def release_model(mo) -> None:
    """Let the collector free a model, its DDP and its optimizer (a next model in the same
    process then has the GPU's memory: tools/gpu_check's variants, the kernel table's host
    probe): the schedule's callbacks on the TransformerConfig (bound methods of DDP and the
    optimizer) are the link by which something outside Python's view keeps the whole graph
    alive, so they are cleared; and megatron-core's ``RotaryEmbedding.forward`` is an
    ``lru_cache`` keyed by the module itself, which keeps the last model alive through its
    hooks, so it is dropped."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    for name in ("no_sync_func", "grad_sync_func", "param_sync_func",
                 "finalize_model_grads_func", "grad_scale_func"):
        if hasattr(mo.config, name):
            setattr(mo.config, name, None)
    cached = getattr(RotaryEmbedding.forward, "cache_clear", None)
    if cached is not None:
        cached()
