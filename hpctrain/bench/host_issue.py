"""The host's time to issue a step's work: the kernel table's ``host`` section.

A GPU runs a layer's kernels only as fast as the host hands them over. On an H100 and an H200
the host needed 4.6-5.7 ms to issue one layer's forward and backward (hpctrain's build of
megatron-core's GPT, tools/gpu_check), so a layout with less GPU work than that per layer and
microbatch runs at the host's pace, whatever its kernels cost. The planner prices that only
if it knows the host's time; this measures it on the machine that will train, as part of the
kernel table (``hpctrain bench kernels``).

How: hpctrain's own build of the model (``runtime.model.build_model_and_optimizer``, the one
training uses) at tiny widths, so that every kernel is a few microseconds of GPU work and the
time to return from megatron-core's forward-backward schedule is the host's alone; at two
depths, so that the difference is the time per layer and the rest the time per microbatch
(embedding, output layer, loss, the schedule). For each kind of layer the planner tells apart
(``gpu_table.HOST_KINDS``): megatron-core's local spec as it comes (``local``: its unfused
attention, no fusions) and hpctrain's defaults (``torch``: torch's fused attention kernels,
the compiled RoPE, the fused cross entropy and AdamW). The least of the timed steps, after a
warm-up that builds the compiled kernels: the host cannot issue the work faster than it can,
and the least is the figure other load on the machine disturbs least.

On the CPU (the tests) the kernels run as they are issued: the figure is the CPU's time for the
tiny model, which is what bounds a CPU step of tiny layers too.
"""

from __future__ import annotations

import time

# tiny widths: the GPU's work per kernel is negligible beside the host's issuing of it
PROBE_MODEL = dict(hidden_size=128, num_attention_heads=4, ffn_hidden_size=352,
                   activation="swiglu", normalization="RMSNorm", position_embedding_type="rope",
                   add_bias_linear=False, untie_embeddings_and_output_weights=True,
                   vocab_size=1024, seq_length=64)
DEPTHS = (2, 8)
MICROBATCHES = 4
STEPS = dict(warmup=3, timed=6)
# the kinds of layer (gpu_table.HOST_KINDS) and what sets each apart in a job
KINDS = {"local": {"model": {"attention_backend": "local", "apply_rope_fusion": False,
                             "cross_entropy_loss_fusion": False},
                   "train": {"fused_adam": False}},
         "torch": {}}


def probe_job(kind: str, layers: int, device: str) -> dict:
    """The job whose issue time is measured: tiny widths, ``layers`` deep, one microbatch of
    one sequence at a time, ``MICROBATCHES`` per step."""
    job = {"name": f"host-issue-{kind}-{layers}",
           "model": {**PROBE_MODEL, "num_layers": layers, "transformer_impl": "local"},
           "parallel": {"use_distributed_optimizer": True},
           "batch": {"micro_batch_size": 1, "global_batch_size": MICROBATCHES},
           "train": {"steps": STEPS["warmup"] + STEPS["timed"], "lr": 1e-4, "min_lr": 1e-5,
                     "warmup_steps": 1, "seed": 1234,
                     "precision": "bf16" if device == "cuda" else "fp32"},
           "data": {"path": "unused"},
           "checkpoint": {"interval_steps": 0, "interval_minutes": 0, "save_at_end": False}}
    for section, values in KINDS[kind].items():
        job[section].update(values)
    return job


def _build(kind: str, layers: int, device: str):
    """hpctrain's build of the probe job (model, DDP, optimizer) and its microbatches."""
    import torch

    from ..config import Layout, job_from_mapping
    from ..runtime.model import build_model_and_optimizer
    job = job_from_mapping(probe_job(kind, layers, device), "host issue probe")
    mo = build_model_and_optimizer(job, Layout(1, 1, None, 1, 1, MICROBATCHES), device)
    seq = job.model.seq_length
    tokens = torch.randint(0, job.model.vocab_size, (MICROBATCHES, seq + 1),
                           generator=torch.Generator().manual_seed(1)).to(device)
    return mo, tokens


def _step_seconds(mo, tokens, device: str) -> float:
    """One training step of the probe: seconds until the forward-backward schedule returned
    (the device synchronized before, never inside)."""
    import torch
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    seq = tokens.shape[1] - 1
    pos = torch.arange(seq, device=device).unsqueeze(0)
    batches = iter([(tokens[j:j + 1, :-1].contiguous(), tokens[j:j + 1, 1:].contiguous())
                    for j in range(MICROBATCHES)])

    def forward_step(it, model):
        x, y = next(it)
        return model(x, pos, None, labels=y), lambda o: (o.float().mean(), {})

    mo.model[0].zero_grad_buffer()
    mo.optimizer.zero_grad()
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    get_forward_backward_func()(forward_step_func=forward_step, data_iterator=batches,
                                model=mo.model[0], num_microbatches=MICROBATCHES,
                                seq_length=seq, micro_batch_size=1, forward_only=False)
    seconds = time.perf_counter() - started
    mo.optimizer.step()
    return seconds


def issue_seconds(kind: str, device: str) -> dict[int, float]:
    """Per depth in ``DEPTHS``: the least seconds the host took to issue one step's
    ``MICROBATCHES`` microbatches. The depths' steps alternate, so that whatever else loads
    the machine meanwhile weighs on both alike (their difference is the layers' time)."""
    built = {layers: _build(kind, layers, device) for layers in DEPTHS}
    times: dict[int, list[float]] = {layers: [] for layers in DEPTHS}
    try:
        for step in range(STEPS["warmup"] + STEPS["timed"]):
            for layers, (mo, tokens) in built.items():
                seconds = _step_seconds(mo, tokens, device)
                if step >= STEPS["warmup"]:
                    times[layers].append(seconds)
    finally:
        from ..runtime.model import release_model
        for mo, _ in built.values():
            release_model(mo)
        built.clear()
    return {layers: min(t) for layers, t in times.items()}


def measure_host_issue(device: str, kinds=tuple(KINDS), deadline: float | None = None) -> dict | None:
    """The table's ``host`` section: per kind, seconds per layer and per microbatch (each at
    least zero: a negative difference is noise on a host that issues layers in no time).
    Kinds the deadline leaves out are not in it; None when none was measured."""
    per_layer, per_microbatch = {}, {}
    shallow, deep = DEPTHS
    for kind in kinds:
        if deadline is not None and time.monotonic() > deadline:
            break
        seconds = issue_seconds(kind, device)
        t_shallow, t_deep = seconds[shallow] / MICROBATCHES, seconds[deep] / MICROBATCHES
        layer = max(0.0, (t_deep - t_shallow) / (deep - shallow))
        per_layer[kind] = layer
        per_microbatch[kind] = max(0.0, t_shallow - shallow * layer)
    if not per_layer:
        return None
    return {"per_layer_s": per_layer, "per_microbatch_s": per_microbatch}
