"""What goes into a checkpoint, and getting it back into a live model and optimizer.

A checkpoint is one ``dist_checkpointing`` sharded state dict:

* ``model`` (``model0``, ``model1``, ... with a virtual pipeline): the chunks' sharded
  tensors, whose keys are global (layer numbers included), so any TP/PP/VPP/DP reads them;
* ``optimizer``: Adam's moments; the distributed optimizer writes them in the format of
  ``checkpoint.optimizer_format``: ``fully_reshardable`` (it gathers each DP group's shards;
  loads on any layout) or ``dp_reshardable`` (each rank's own shard; only the DP size may
  change on resume);
* ``rng``: one object per rank (python/numpy/torch/cuda and megatron's tracker), restored
  only when the layout is unchanged (on another layout there is no rank to give it to);
* ``hpctrain``: step, consumed samples, optimizer updates, LR schedule, guard state — the
  same on every rank (dist_checkpointing checks that) and stored once.

megatron-core 0.16.1 needs four fixes, each caught by a resume test that compares losses
(1-3 with torch's Adam, i.e. without Apex/TE: always so on CPU; 4 everywhere):
1. the distributed optimizer must have state before ``sharded_state_dict(is_loading=True)``
   (``_init_optimizer_states_with_dummy_values``), and loading runs under ``no_grad``;
2. its fully-reshardable loader copies every state key but is never given Adam's ``step``
   (KeyError): the step is set aside while each parameter loads;
3. Adam's ``step`` is restored from our own count of optimizer updates, never trusted to
   the loader (with ``dp_reshardable`` it is silently left at its pre-load value), and put
   where the optimizer class keeps it (``optimizer_step``: per parameter for torch's Adam,
   per param group for Transformer Engine's and apex's FusedAdam);
4. the fully-reshardable save drops the padding between gradient buckets and then indexes
   with offsets that include it, so parameters after a padded bucket are written shifted
   (megatron warns "param range exceeds unpadded buffer"); see ``_buffer_aligned``.
"""

from __future__ import annotations

from . import optimizer_step

DISTOPT_FORMATS = ("fully_reshardable", "dp_reshardable")
RNG_KEY = "hpctrain.rng_state"


def model_key(index: int, chunks: int) -> str:
    return "model" if chunks == 1 else f"model{index}"


def model_sharded_state(model) -> dict:
    return {model_key(i, len(model)): m.module.sharded_state_dict() for i, m in enumerate(model)}


def load_model_state(model, loaded: dict) -> None:
    for i, m in enumerate(model):
        m.module.load_state_dict(loaded[model_key(i, len(model))])


def sub_optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _is_distributed(opt) -> bool:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    return isinstance(opt, DistributedOptimizer)


def optimizer_metadata(fmt: str) -> dict:
    if fmt not in DISTOPT_FORMATS:
        raise ValueError(f"unknown distributed optimizer format {fmt!r}")
    return {"distrib_optim_sharding_type": fmt}


def rank_coordinates() -> tuple[tuple[int, ...], tuple[int, ...]]:
    from megatron.core import parallel_state as ps
    shape = (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size(),
             ps.get_data_parallel_world_size())
    offset = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(),
              ps.get_data_parallel_rank())
    return shape, offset


def rng_sharded_object(data):
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    shape, offset = rank_coordinates()
    return ShardedObject(RNG_KEY, data, shape, offset, replica_id=0)


def _buffer_aligned(o):
    """Wrap one distributed optimizer's ``get_parameter_state_dp_zero`` (fix 4).

    It gathers each bucket's state and concatenates the buckets WITHOUT the padding between
    them, while the fully-reshardable writer slices that result with buffer offsets that
    INCLUDE the padding: every parameter after a padded bucket (e.g. the tied embedding,
    which gets its own bucket when PP > 1) is saved shifted, its tail zero-filled. Putting the
    padding back makes the offsets right.
    """
    import torch
    original = o.get_parameter_state_dp_zero

    def aligned(*args, **kwargs):
        state = original(*args, **kwargs)
        if not state or kwargs.get("empty_data"):
            return state
        for gbuf_idx, buffer in enumerate(o.buffers):
            for world in state[gbuf_idx].values():
                if "param" not in world:
                    continue
                padded = {k: torch.zeros(buffer.numel, dtype=world[k].dtype)
                          for k in ("param", "exp_avg", "exp_avg_sq")}
                offset = 0
                for bucket, (start, _) in zip(buffer.buckets, buffer.bucket_indices):
                    n = bucket.numel_unpadded
                    for k in padded:
                        padded[k][start:start + n] = world[k][offset:offset + n]
                    offset += n
                world.update(padded)
                world["numel_unpadded"] = buffer.numel
        return state

    return original, aligned


def optimizer_sharded_state(optimizer, model_sd: dict, fmt: str) -> dict:
    restore = []
    for o in sub_optimizers(optimizer):
        if _is_distributed(o) and fmt == "fully_reshardable":
            original, aligned = _buffer_aligned(o)
            o.get_parameter_state_dp_zero = aligned
            restore.append((o, original))
    try:
        return optimizer.sharded_state_dict(model_sd, metadata=optimizer_metadata(fmt))
    finally:
        for o, original in restore:
            o.get_parameter_state_dp_zero = original


def full_sharded_state(mo, common: dict, rng_state, fmt: str) -> dict:
    """The state dict a checkpoint save writes."""
    sd = model_sharded_state(mo.model)
    sd["optimizer"] = optimizer_sharded_state(mo.optimizer, sd, fmt)
    sd["rng"] = rng_sharded_object(rng_state)
    sd["hpctrain"] = common
    return sd


def prepare_optimizer_for_load(optimizer) -> None:
    """Give a fresh distributed optimizer the state tensors a load fills in place (fix 1)."""
    for o in sub_optimizers(optimizer):
        if _is_distributed(o) and len(o.optimizer.state) == 0:
            o._init_optimizer_states_with_dummy_values()


def loading_template(mo, with_rng: bool, fmt: str) -> dict:
    """The sharded state dict that tells dist_checkpointing what to read into (``fmt``: the
    format the checkpoint was saved in)."""
    prepare_optimizer_for_load(mo.optimizer)
    sd = model_sharded_state(mo.model)
    sd["optimizer"] = mo.optimizer.sharded_state_dict(sd, is_loading=True,
                                                      metadata=optimizer_metadata(fmt))
    if with_rng:
        sd["rng"] = rng_sharded_object(None)
    return sd


def _step_set_aside(o):
    """Wrap one distributed optimizer's per-parameter setter so Adam's step is left alone (fix 2)."""
    original = o._set_main_param_and_optimizer_states

    def setter(model_param, tensors):
        group, order = o.model_param_group_index_map[model_param]
        state = o.optimizer.state[o.optimizer.param_groups[group]["params"][order]]
        step = state.pop("step", None)
        try:
            original(model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step

    return original, setter


def load_optimizer_state(optimizer, loaded_optimizer_state, updates: int) -> None:
    import torch

    restore = []
    for o in sub_optimizers(optimizer):
        if _is_distributed(o):
            original, setter = _step_set_aside(o)
            o._set_main_param_and_optimizer_states = setter
            restore.append((o, original))
    fused = optimizer_step.fused_adam_in_use(optimizer)
    try:
        with torch.no_grad(), optimizer_step.load_in_own_step_format(optimizer, updates):
            optimizer.load_state_dict(loaded_optimizer_state)
    finally:
        for o, original in restore:
            o._set_main_param_and_optimizer_states = original
    # the checkpoint's param groups carried its saver's flags: this run's choice stands
    optimizer_step.set_fused_adam(optimizer, fused)
    set_adam_step(optimizer, updates)


def set_adam_step(optimizer, updates: int) -> None:
    """Adam's bias correction counts updates: make the count ``updates`` wherever the
    optimizer class keeps it (fix 3; per class in ``optimizer_step``)."""
    optimizer_step.set_step(optimizer, updates)

