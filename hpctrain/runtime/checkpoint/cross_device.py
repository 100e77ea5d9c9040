"""Checkpoints that cross devices or layer implementations: what loads, what is refused.

A checkpoint saved by the CPU rehearsal (megatron-core's local layer spec, fp32) may be
resumed on GPUs with Transformer Engine's spec, and the other way round. What megatron-core
0.16.1 writes for the two specs (``gpt_layer_specs.py``, ``extensions/transformer_engine.py``):

* **parameters**: the same keys. The local spec maps its norms onto TE's fused names
  (``sharded_state_dict_keys_map``: ``input_layernorm.`` -> ``self_attention.linear_qkv.
  layer_norm_``, ``pre_mlp_layernorm.`` -> ``mlp.linear_fc1.layer_norm_``), so weights reshard
  across specs as they do across layouts;
* **``_extra_state``** (TE's FP8 metadata, a ``ShardedObject`` per module): megatron's local
  linears write an empty one "for TE compatibility", but TE modules have extra state where the
  local spec has none (e.g. TE's norm modules, the final LayerNorm). A load that asks for an
  ``_extra_state`` the checkpoint lacks keeps the module's own (fresh) value and says so; in
  bf16/fp16 training it holds nothing. Any other entry the checkpoint lacks is refused before
  anything is read, naming the entries, instead of failing inside the storage layer;
* **the distributed optimizer's ``dp_reshardable`` format** stores flat per-bucket buffers
  whose layout follows the saving model's parameters and buckets: across implementations that
  is refused with the fix (``fully_reshardable`` stores per-parameter tensors and loads);
* **RNG states**: the CPU rehearsal's "CUDA" tracker states are CPU generator states. They are
  restored only when the device and the layout match; otherwise every stream restarts from
  the seed, logged.

The manifest records ``device`` and ``layers`` (implementation, attention backend) from now on;
a manifest without them is from the CPU rehearsal's local spec (all older checkpoints were).
"""

from __future__ import annotations

EXTRA_STATE_SUFFIX = "_extra_state"


def _error(message: str):
    from ...record.checkpoint_store import CheckpointError
    return CheckpointError(message)


def saved_impl(manifest: dict | None) -> str:
    return ((manifest or {}).get("layers") or {}).get("transformer_impl", "local")


def saved_device(manifest: dict | None) -> str:
    return (manifest or {}).get("device", "cpu")


def check_resume(folder, manifest: dict, here_impl: str, distopt: bool, fmt: str) -> None:
    """Refuse, before anything is read, what cannot load across implementations."""
    there = saved_impl(manifest)
    if distopt and fmt == "dp_reshardable" and there != here_impl:
        raise _error(
            f"checkpoint {folder} was saved with model.transformer_impl: {there} and stores the "
            f"distributed optimizer as dp_reshardable, whose flat buffers follow the saving "
            f"model's parameters; this run uses {here_impl}. Resume with model.transformer_impl: "
            f"{there}, or start from its weights with train.init_from (optimizer state restarts)")


def restore_rng_here(manifest: dict | None, rng_state: dict | None, device: str,
                     same_layout: bool) -> tuple[bool, str]:
    """Whether the saved RNG states belong to this rank's generators, and why not."""
    if not same_layout:
        return False, "layout changed"
    there = (rng_state or {}).get("device") or (manifest or {}).get("device")
    if there is None and rng_state is not None:
        # rng.capture before the device was recorded: a CUDA state only on GPUs
        there = "cpu" if rng_state.get("cuda") is None else "cuda"
    if there != device:
        return False, f"saved on {there}, now {device}"
    return True, ""


def model_keys(template: dict) -> list[str]:
    return [k for k in template if k == "model" or (k.startswith("model") and k[5:].isdigit())]


def set_aside_absent_entries(template: dict, folder, what: str) -> dict:
    """Compare the model entries ``template`` asks for with the checkpoint's (its metadata
    only). ``_extra_state`` entries it lacks are taken out of the template and returned (put
    them back with :func:`put_back`); any other missing entry raises CheckpointError."""
    from megatron.core.dist_checkpointing.mapping import ShardedBase
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    present = {getattr(v, "key", k) for k, v in load_sharded_metadata(str(folder)).items()}
    kept, missing = {}, []
    for mk in model_keys(template):
        for local_key, sh in list(template[mk].items()):
            if not isinstance(sh, ShardedBase) or sh.key in present:
                continue
            if sh.key.endswith(EXTRA_STATE_SUFFIX):
                kept[(mk, local_key)] = template[mk].pop(local_key).data
            else:
                missing.append(sh.key)
    if missing:
        sample = ", ".join(sorted(missing)[:4]) + (" ..." if len(missing) > 4 else "")
        raise _error(
            f"{what} {folder} lacks {len(missing)} model entries this run's layers need "
            f"({sample}): it was written for another model (shape, activation, normalization or "
            f"layer implementation); check the job's model section against the run that saved it")
    return kept


def put_back(loaded: dict, kept: dict) -> None:
    """The modules' own ``_extra_state`` values where the checkpoint had none."""
    for (mk, local_key), value in kept.items():
        loaded[mk][local_key] = value


def describe_kept(kept: dict) -> str:
    return (f"{len(kept)} _extra_state entries (Transformer Engine's FP8 metadata) absent from "
            f"the checkpoint keep this model's fresh values")
