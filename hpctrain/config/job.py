"""Job files: one training run, in Megatron-LM's vocabulary.

``model``, ``parallel`` and ``batch`` use Megatron-LM's argument names so its users can copy
values across; ``train``, ``data`` and ``checkpoint`` hold the rest of a run. The layout checks
that need the cluster (world size) live in ``layout.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import safety
from .problems import Problems
from .resilience import JobResilienceSection
from .schema import doc
from .tracking import TrackingSection, check_tracking

MAX_LAYERS = 512   # several times the deepest published LLM; bounds the planner's enumeration


@dataclass(kw_only=True)
class ModelSection:
    num_layers: int = doc("Transformer layers.", at_least=1, at_most=MAX_LAYERS)
    hidden_size: int = doc("Hidden size h.", at_least=1, at_most=2**18)
    num_attention_heads: int = doc("Attention heads a.", at_least=1, at_most=4096)
    num_query_groups: int | None = doc("Key/value groups for GQA (null: = heads, plain MHA).",
                                       default=None, at_least=1, at_most=4096)
    ffn_hidden_size: int | None = doc("MLP hidden size (null: 4h).", default=None, at_least=1,
                                      at_most=2**20)
    kv_channels: int | None = doc("Per-head size (null: h / a).", default=None, at_least=1,
                                  at_most=2**16)
    vocab_size: int = doc("Tokenizer vocabulary size (padded as Megatron pads it).", at_least=1,
                          at_most=2**24)
    make_vocab_size_divisible_by: int = doc("Pad the vocabulary to a multiple of lcm(this, TP): the "
                                            "same size on every TP ≤ this, so checkpoints reshard.",
                                            default=128, at_least=1, at_most=2**16)
    seq_length: int = doc("Sequence length s.", at_least=1, at_most=2**24)
    max_position_embeddings: int | None = doc("Positions (null: seq_length).", default=None,
                                              at_least=1, at_most=2**24)
    position_embedding_type: str = doc("learned_absolute or rope.",
                                       choices=("learned_absolute", "rope"),
                                       default="learned_absolute")
    rotary_base: int = doc("RoPE base.", default=10000, at_least=1, at_most=10**10)
    activation: str = doc("MLP activation.", choices=("gelu", "swiglu"), default="gelu")
    normalization: str = doc("Norm layer.", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    layernorm_epsilon: float = doc("Norm epsilon.", default=1e-5, above=0, at_most=1)
    add_bias_linear: bool = doc("Biases in linear layers.", default=True)
    untie_embeddings_and_output_weights: bool = doc("Separate output layer (false: tied to the "
                                                    "input embedding).", default=False)
    attention_backend: str = doc("Attention kernels. With transformer_engine: Transformer "
                                 "Engine's auto, flash, fused (cuDNN) or unfused. With local "
                                 "(and on the CPU): auto, flash or fused run torch's fused "
                                 "attention (scaled_dot_product_attention; auto tries "
                                 "FlashAttention-2, then cuDNN, then memory-efficient; flash "
                                 "and fused pin one), local or unfused megatron-core's unfused "
                                 "attention (stores the a·s² scores). Fused kernels store no "
                                 "scores (planner).",
                                 choices=("auto", "flash", "fused", "unfused", "local"),
                                 default="auto")
    transformer_impl: str = doc("Layers on GPUs (Megatron-LM's --transformer-impl): "
                                "transformer_engine (fused/flash attention; the ranks stop at "
                                "start when TE cannot be imported) or local (megatron-core's own "
                                "layers; attention per attention_backend). CPU always runs "
                                "local.",
                                choices=("transformer_engine", "local"),
                                default="transformer_engine")
    apply_rope_fusion: bool = doc("RoPE in one fused kernel on GPUs (Megatron-LM's default; "
                                  "--no-rope-fusion): Transformer Engine's, or with the local "
                                  "spec megatron-core's own RoPE compiled by torch.compile.",
                                  default=True)
    cross_entropy_loss_fusion: bool = doc("megatron-core's native fused cross entropy on GPUs "
                                          "(torch.compile'd; its logits gradient is bf16, so "
                                          "bf16 training only, and not in deterministic mode).",
                                          default=True)
    hidden_dropout: float = doc("Dropout after attention/MLP.", default=0.0, at_least=0, below=1)
    attention_dropout: float = doc("Dropout on attention probabilities.", default=0.0, at_least=0,
                                   below=1)
    init_method_std: float = doc("Std of the normal weight init.", default=0.02, above=0, at_most=10)


@dataclass(kw_only=True)
class ParallelSection:
    tensor_model_parallel_size: int = doc("TP: ranks splitting each layer (within a node).",
                                          default=1, at_least=1, at_most=64)
    pipeline_model_parallel_size: int = doc("PP: pipeline stages.", default=1, at_least=1,
                                            at_most=MAX_LAYERS)
    virtual_pipeline_model_parallel_size: int | None = doc("VPP: model chunks per stage "
                                                           "(interleaved 1F1B); null: off.",
                                                           default=None, at_least=1,
                                                           at_most=MAX_LAYERS)
    data_parallel_size: int | None = doc("DP (null: world size / (TP × PP)).", default=None,
                                         at_least=1, at_most=131072)
    sequence_parallel: bool = doc("Shard norms/dropout activations along the sequence (needs TP>1).",
                                  default=False)
    use_distributed_optimizer: bool = doc("ZeRO-1: shard optimizer state across DP ranks.",
                                          default=False)
    overlap_grad_reduce: bool = doc("Reduce gradients bucket by bucket during the backward pass.",
                                    default=True)
    overlap_param_gather: bool = doc("Distributed optimizer: gather updated parameters during the "
                                     "next forward pass.", default=True)
    overlap_p2p_comm: bool = doc("Interleaved schedule: overlap pipeline sends/receives with "
                                 "compute (batched p2p otherwise).", default=True)
    deallocate_pipeline_outputs: bool = doc("PP > 1 on GPUs: free each stage output's data "
                                            "once sent, keeping only its autograd graph "
                                            "(Megatron-LM always does).", default=True)
    ddp_bucket_size: int | None = doc("Parameters per gradient-reduction bucket (null: "
                                      "megatron-core's max(40M, 1M × DP)).", default=None,
                                      at_least=1, at_most=10**12)


@dataclass(kw_only=True)
class BatchSection:
    micro_batch_size: int = doc("Sequences per microbatch per rank.", at_least=1, at_most=2**16)
    global_batch_size: int = doc("Sequences per optimizer step, all ranks together.", at_least=1,
                                 at_most=2**24)


@dataclass(kw_only=True)
class StabilitySection:
    skip_nonfinite: bool = doc("Skip the update when the loss or grad norm is NaN/inf.", default=True)
    spike_factor: float = doc("Skip the update when loss > factor × running mean (0: off).",
                              default=3.0, at_least=0, at_most=1e6)
    spike_window: int = doc("Steps in the running mean for spike detection.", default=20,
                            at_least=1, at_most=10**6)
    max_skipped_steps: int = doc("Stop the run after this many skipped updates in a row.",
                                 default=5, at_least=1, at_most=10**6)


@dataclass(kw_only=True)
class TrainSection:
    steps: int = doc("Optimizer steps (Megatron: train_iters).", at_least=1, at_most=10**9)
    lr: float = doc("Peak learning rate.", default=3e-4, above=0, at_most=10)
    min_lr: float = doc("Learning rate at the end of decay.", default=0.0, at_least=0, at_most=10)
    schedule: str = doc("Decay after warmup (Megatron: lr_decay_style).",
                        choices=("cosine", "wsd", "linear", "constant"), default="cosine")
    warmup_steps: int = doc("Linear warmup steps.", default=0, at_least=0, at_most=10**9)
    wsd_decay_steps: int | None = doc("wsd: steps of the final decay (null: 10% of steps).",
                                      default=None, at_least=0, at_most=10**9)
    weight_decay: float = doc("AdamW weight decay.", default=0.01, at_least=0, at_most=100)
    adam_beta1: float = doc("Adam beta1.", default=0.9, at_least=0, below=1)
    adam_beta2: float = doc("Adam beta2.", default=0.95, at_least=0, below=1)
    adam_eps: float = doc("Adam epsilon.", default=1e-8, above=0, at_most=1)
    clip_grad: float = doc("Gradient clipping by global norm (0: off).", default=1.0, at_least=0,
                           at_most=1e6)
    precision: str = doc("bf16 or fp16 (with fp32 main params) on GPU; CPU always runs fp32.",
                         choices=("bf16", "fp16", "fp32"), default="bf16")
    grad_reduce_in_fp32: bool = doc("Keep and reduce gradients in fp32 (megatron-core's default).",
                                    default=True)
    recompute_granularity: str | None = doc("Activation recomputation: null, selective or full.",
                                            choices=("selective", "full"), default=None)
    recompute_method: str = doc("full recompute: uniform or block.", choices=("uniform", "block"),
                                default="uniform")
    recompute_num_layers: int = doc("full recompute: layers per recompute group.", default=1,
                                    at_least=1, at_most=MAX_LAYERS)
    seed: int = doc("Seed for weights, data order and dropout.", default=1234, at_least=0,
                    at_most=2**32 - 1)
    log_interval: int = doc("Print/record metrics every N steps.", default=1, at_least=1,
                            at_most=10**9)
    eval_interval: int | None = doc("Validation loss every N steps, on the validation split "
                                    "(null: no evaluation).", default=None, at_least=1,
                                    at_most=10**9)
    eval_iters: int = doc("Global batches per evaluation (the same samples every time).",
                          default=10, at_least=1, at_most=10**6)
    eval_at_end: bool = doc("Test loss on the test split when training finishes.", default=False)
    profile_step: int | None = doc("Profile this step with torch.profiler on every rank (as "
                                   "Megatron-LM's --profile): whether the host or the GPU bounds "
                                   "it and the operators with the most host time, in the "
                                   "attempt's folder (profile-step-N-rank-R.json; rank 0's whole "
                                   "trace beside it, gzipped); null: none.", default=None,
                                   at_least=1, at_most=10**9)
    init_from: str | None = doc("Model-only checkpoint to start from (a fresh run's weights).",
                                default=None)
    init_timeout_s: int = doc("Give up forming the process group after this long (names host:port).",
                              default=300, at_least=1, at_most=86400)
    manual_gc: bool = doc("Python's automatic garbage collection off; every rank collects at the "
                          "same steps instead (Megatron-LM's --manual-gc).", default=True)
    manual_gc_interval: int = doc("manual_gc: collect every N steps (0: only once, before the "
                                  "first step).", default=100, at_least=0, at_most=10**9)
    fused_adam: bool = doc("torch's fused AdamW (one kernel per step, in place) where "
                           "megatron-core falls back to torch's optimizer (no Transformer "
                           "Engine nor apex); false: torch's default foreach AdamW.",
                           default=True)
    deterministic_mode: bool = doc("Bitwise-reproducible training (Megatron-LM's "
                                   "--deterministic-mode): torch.use_deterministic_algorithms, "
                                   "CUBLAS_WORKSPACE_CONFIG=:4096:8, NCCL_ALGO=Ring unless set, "
                                   "attention kernels with a deterministic backward (no cuDNN), "
                                   "no cross-entropy fusion. A resumed run then ends with the "
                                   "uninterrupted run's weights bit for bit on GPUs too; slower.",
                                   default=False)
    stability: StabilitySection = doc("Loss-spike and NaN guard.", default_factory=StabilitySection)


@dataclass(kw_only=True)
class CorpusEntry:
    path: str = doc("Prefix of a Megatron indexed dataset (PATH.bin + PATH.idx), relative to the "
                    "job file.")
    weight: float = doc("Share of the samples drawn from this corpus (weights are normalised; "
                        "Megatron-LM's --data-path WEIGHT PATH).", default=1.0, above=0,
                        at_most=1e12)
    prepare_from: list[str] = doc("Text/JSONL files to prepare into `path` when it does not exist "
                                  "yet.", default_factory=list)


@dataclass(kw_only=True)
class DataSection:
    path: str | None = doc("Prefix of a Megatron indexed dataset (PATH.bin + PATH.idx), relative "
                           "to the job file: one corpus (or give `blend`).", default=None)
    blend: list[CorpusEntry] = doc("Several corpora, each {path, weight, prepare_from}: the "
                                   "training samples are drawn from them in proportion to their "
                                   "weights (instead of `path`).", default_factory=list)
    split: str | None = doc("Megatron-LM's train,valid,test split of every corpus's documents, "
                            "e.g. \"969,30,1\" (null: all for training, or the validation/test "
                            "corpora of valid_blend/test_blend).", default=None)
    valid_blend: list[CorpusEntry] = doc("Separate validation corpora (instead of a split).",
                                         default_factory=list)
    test_blend: list[CorpusEntry] = doc("Separate test corpora (instead of a split).",
                                        default_factory=list)
    tokenizer: str = doc("byte (built in), a local Hugging Face tokenizer folder, a SentencePiece "
                         ".model or a tiktoken ranks file (for prepare; extras "
                         "hf-tokenizers, sentencepiece, tiktoken).",
                         default="byte")
    prepare_from: list[str] = doc("Text/JSONL files to prepare into `path` when it does not exist "
                                  "yet (hpctrain data prepare).", default_factory=list)
    json_key: str = doc("Field of JSONL records holding the text.", default="text")
    num_workers: int | None = doc("DataLoader worker processes per reading rank (null: 2 on GPU, "
                                  "as Megatron-LM; 0 on the CPU rehearsal).", default=None,
                                  at_least=0, at_most=256)


@dataclass(kw_only=True)
class CheckpointSection:
    dir: str | None = doc("Checkpoint folder (null: <storage.checkpoint_root>/<run>, or the run "
                          "folder).", default=None)
    interval_steps: int = doc("Save every N steps (0: off).", default=0, at_least=0, at_most=10**9)
    interval_minutes: float | str = doc("Save when this many minutes passed since the last save "
                                        "(0: off), or auto: Young/Daly's interval from the "
                                        "measured save time and the profile's "
                                        "reliability.node_mtbf_hours, printed at start "
                                        "(`hpctrain plan` shows both).", choices=("auto",),
                                        default=15.0, at_least=0, at_most=525600)
    keep_last: int = doc("Complete checkpoints kept; the newest is never deleted.", default=3,
                         at_least=1, at_most=10**6)
    async_save: bool = doc("Write periodic checkpoints in the background.", default=True)
    save_at_end: bool = doc("Save when training finishes.", default=True)
    deadline_safety_factor: float = doc("Save and exit when the time left < save time × this + "
                                        "margin.", default=2.0, at_least=0, at_most=100)
    deadline_margin_s: float = doc("Margin added to the deadline check.", default=30.0, at_least=0,
                                   at_most=86400)
    optimizer_format: str = doc("How the distributed optimizer's state is saved: "
                                "fully_reshardable (resumes on any TP/PP/VPP/DP; saving rebuilds "
                                "the whole TP×PP shard's optimizer state in host memory on every "
                                "DP rank, through the GPU), dp_reshardable (Megatron-LM's default: "
                                "every rank writes its own shard, nothing gathered, but only the DP "
                                "size may change on resume), or auto: dp_reshardable on GPUs "
                                "(fully_reshardable's save blocked training ~6x longer on an "
                                "H200), on the CPU rehearsal fully_reshardable when its save fits "
                                "half the node's host memory (resolved at submit, recorded in the "
                                "run's job.yaml; `hpctrain plan` shows the choice and the save's "
                                "memory and time).",
                                choices=("auto", "fully_reshardable", "dp_reshardable"),
                                default="auto")


@dataclass(kw_only=True)
class HealthSection:
    hang_timeout_s: int | None = doc("A rank that makes no progress (no step finished, no "
                                     "save/load phase advanced) for this long is hung: every "
                                     "rank's stacks are dumped, the attempt ends and the requeue "
                                     "excludes its node (null: 20 × the slowest step, at least "
                                     "5 minutes on GPU and 1 minute on the CPU rehearsal; at "
                                     "least train.init_timeout_s until the first step is done).",
                                     default=None, at_least=10, at_most=7 * 86400)
    dump_stacks: bool = doc("On a hang, write every rank's Python stacks (and native frames with "
                            "py-spy, when installed) to logs/attempt-N/stacks-rank-R.txt.",
                            default=True)
    straggler_factor: float = doc("A node is a straggler when one of its ranks' compute time "
                                  "per step is above this × the median of all ranks.",
                                  default=1.3, above=1, at_most=1000)
    straggler_window: int = doc("Log intervals (train.log_interval) in a row a node must be "
                                "that slow to be named a straggler.",
                                default=3, at_least=1, at_most=10**6)
    exclude_stragglers: bool = doc("Save, requeue and exclude a straggler node (once per node, "
                                   "within preemption.max_requeues); false: only name it.",
                                   default=False)


@dataclass(kw_only=True)
class JobConfig:
    name: str = doc("Run name: letters, digits and _.+-, not starting with - or . (becomes "
                    "the Slurm job name).")
    model: ModelSection = doc("The GPT model.")
    parallel: ParallelSection = doc("Parallel layout.", default_factory=ParallelSection)
    batch: BatchSection = doc("Batch sizes.")
    train: TrainSection = doc("Optimization.")
    data: DataSection = doc("Training data.")
    checkpoint: CheckpointSection = doc("Checkpointing.", default_factory=CheckpointSection)
    health: HealthSection = doc("Hung ranks and stragglers, watched while training runs.",
                                default_factory=HealthSection)
    tracking: TrackingSection = doc("Experiment trackers (W&B, MLflow) the run reports to, "
                                    "beside metrics.jsonl and TensorBoard.",
                                    default_factory=TrackingSection)
    resilience: JobResilienceSection = doc("This job's hot spares and in-job restarts (null "
                                           "fields: the profile's resilience).",
                                           default_factory=JobResilienceSection)


def check_job(j: JobConfig, problems: Problems) -> None:
    """Checks that need only the job itself (not the cluster's world size)."""
    if not j.name and not problems.about("name"):   # `name: true` is wrong, not missing
        problems.add("name", "missing: every job needs a name (1-128 of letters, digits and "
                             "_.+-, not starting with - or .), which starts its run ids")
    safety.check(safety.JOB_NAME, j.name, "name", problems,
                 "job name (1-128 of letters, digits and _.+-, not starting with - or .)")
    safety.check_sbatch_value(j.name, "name", problems)
    d = j.data
    safety.check_path(d.path, "data.path", problems)
    _check_data(j, problems)
    for i, f in enumerate(d.prepare_from or []):
        safety.check_path(f, f"data.prepare_from[{i}]", problems)
    if d.tokenizer != "byte":
        safety.check_path(d.tokenizer, "data.tokenizer", problems)
    safety.check_path(j.train.init_from, "train.init_from", problems)
    t = j.train
    if isinstance(t.profile_step, int) and isinstance(t.steps, int) and t.profile_step > t.steps:
        problems.add("train.profile_step", f"{t.profile_step} is after the last step "
                                           f"(train.steps {t.steps}): profile a step that runs, "
                                           "or set it to null")
    safety.check_path(j.checkpoint.dir, "checkpoint.dir", problems)
    check_tracking(j.tracking, problems)
    if j.tracking is not None and j.tracking.wandb is not None:
        safety.check_path(j.tracking.wandb.dir, "tracking.wandb.dir", problems)
    m = j.model
    if isinstance(m.hidden_size, int) and isinstance(m.num_attention_heads, int) \
            and m.num_attention_heads > 0 and m.kv_channels is None \
            and m.hidden_size % m.num_attention_heads:
        problems.add("model.hidden_size", f"{m.hidden_size} is not divisible by num_attention_heads "
                                          f"({m.num_attention_heads}); set kv_channels or change one")
    if isinstance(m.num_query_groups, int) and isinstance(m.num_attention_heads, int) \
            and m.num_query_groups > 0 and m.num_attention_heads % m.num_query_groups:
        problems.add("model.num_query_groups", f"num_attention_heads ({m.num_attention_heads}) must "
                                               f"be divisible by num_query_groups ({m.num_query_groups})")
    if isinstance(m.max_position_embeddings, int) and isinstance(m.seq_length, int) \
            and m.max_position_embeddings < m.seq_length:
        problems.add("model.max_position_embeddings", f"{m.max_position_embeddings} is shorter than "
                                                      f"seq_length ({m.seq_length})")
    p = j.parallel
    if p.virtual_pipeline_model_parallel_size and p.pipeline_model_parallel_size == 2 \
            and not p.overlap_p2p_comm:
        problems.add("parallel.overlap_p2p_comm", "the interleaved schedule on 2 pipeline stages "
                     "needs it: batched sends/receives between the same two ranks get mismatched "
                     "(Megatron-LM refuses it too); set it true, or use 3 or more stages")
    t = j.train
    if isinstance(t.warmup_steps, int) and isinstance(t.steps, int) and t.warmup_steps > t.steps:
        problems.add("train.warmup_steps", f"{t.warmup_steps} is more than train.steps ({t.steps})")
    if isinstance(t.min_lr, float) and isinstance(t.lr, float) and t.min_lr > t.lr:
        problems.add("train.min_lr", f"{t.min_lr} is above train.lr ({t.lr})")



def _check_data(j: JobConfig, problems: Problems) -> None:
    """One corpus or a blend; a split or separate validation/test corpora; evaluation only
    where there is data to evaluate on."""
    from .split import parse_split
    d, t = j.data, j.train
    for name in ("blend", "valid_blend", "test_blend"):
        for i, entry in enumerate(getattr(d, name) or []):
            if entry is None:
                continue
            safety.check_path(entry.path, f"data.{name}[{i}].path", problems)
            for k, f in enumerate(entry.prepare_from or []):
                safety.check_path(f, f"data.{name}[{i}].prepare_from[{k}]", problems)
    if d.path and d.blend:
        problems.add("data.blend", "give either data.path (one corpus) or data.blend, not both")
    # a blank data.path ("") is not missing: the path door (config.loader) names it blank
    elif d.path is None and not d.blend and d.blend is not None:
        problems.add("data.path", "missing: give data.path (one corpus) or data.blend (a list "
                                  "of {path, weight})")
    if d.prepare_from and d.path is None:
        problems.add("data.prepare_from", "prepares data.path; with data.blend give each "
                                          "corpus its own prepare_from")
    separate = bool(d.valid_blend or d.test_blend)
    shares = None
    if d.split is not None:
        try:
            shares = parse_split(d.split)
        except ValueError as e:
            problems.add("data.split", str(e))
        if separate:
            problems.add("data.split", "give either data.split or data.valid_blend/test_blend, "
                                       "not both")
    if not isinstance(t.eval_interval, int) and not t.eval_at_end:
        return
    has_valid = bool(d.valid_blend) or (shares is not None and shares[1] > 0)
    has_test = bool(d.test_blend) or (shares is not None and shares[2] > 0)
    if isinstance(t.eval_interval, int) and not has_valid and (shares is not None or
                                                               d.split is None):
        problems.add("data.split" if d.split is not None else "data.valid_blend",
                     f"train.eval_interval is set but "
                     + (f"the split {d.split!r} leaves no validation data; give the validation "
                        f"part a share (e.g. \"969,30,1\")" if d.split is not None else
                        "there is no validation data; set data.split (e.g. \"969,30,1\") or "
                        "data.valid_blend"))
    if t.eval_at_end is True and not has_test and (shares is not None or d.split is None):
        problems.add("data.split" if d.split is not None else "data.test_blend",
                     "train.eval_at_end is set but "
                     + (f"the split {d.split!r} leaves no test data" if d.split is not None
                        else "there is no test data; set data.split or data.test_blend"))
