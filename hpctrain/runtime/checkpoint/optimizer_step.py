"""Where Adam keeps its step count, for every optimizer megatron-core may build, and setting it
on resume.

Adam's bias correction divides by ``1 - beta^step``: a resumed run must continue the count,
and the count must be put where the optimizer class reads it. megatron-core 0.16.1's
``get_megatron_optimizer`` (``megatron/core/optimizer/__init__.py``) picks, for ``adam``:

==============================================  =========================================
inner optimizer                                 where the step lives
==============================================  =========================================
Transformer Engine's ``FusedAdam`` (first       ``param_group["step"]``: one int per group,
choice when TE imports)                         ``+= 1`` in ``step()``; no per-parameter
                                                step, and its ``state_dict()`` /
                                                ``load_state_dict()`` map every state key
                                                through ``name_to_dtype_map`` (``exp_avg``,
                                                ``exp_avg_sq``, ``master_param``): a
                                                ``state[p]["step"]`` is a ``KeyError``
apex's ``FusedAdam`` (when apex imports, no TE)  ``param_group["step"]`` as TE; torch's
                                                default ``state_dict`` (any key)
``torch.optim.AdamW`` / ``Adam`` (neither: the   ``state[p]["step"]``, a 0-dim float tensor
CPU rehearsal)                                  per parameter
``HybridDeviceOptimizer`` (megatron's           its sub-optimizers' rules (a GPU FusedAdam,
``optimizer_cpu_offload``; hpctrain never        CPU ``torch.optim.AdamW``); its own
turns it on)                                    ``param_groups`` are copied into the
                                                sub-optimizers before every step, so a
                                                ``"step"`` left there would freeze the GPU
                                                sub-optimizer's count
==============================================  =========================================

The inner optimizer sits in ``DistributedOptimizer`` (ZeRO-1), ``Float16OptimizerWithFloat16Params``
(bf16/fp16) or ``FP32Optimizer``, possibly inside a ``ChainedOptimizer``; precision-aware
FusedAdam (``use_precision_aware_optimizer``, not used by hpctrain) keeps the step in groups
too. megatron-core's own load puts a checkpoint's step back only in some of these combinations
(e.g. ``dp_reshardable`` with torch Adam leaves it at its pre-load value), so hpctrain sets
it from its own count of optimizer updates, per class, with :func:`set_step`; a state dict
written by one kind (a CPU checkpoint: per-parameter steps) loads into the other with
:func:`load_in_own_step_format` around the load. An optimizer class not in this table is
refused with a message rather than guessed at.
"""

from __future__ import annotations

import contextlib

from ...errors import HpcTrainError

STATE = "state"              # torch.optim.Adam/AdamW: state[p]["step"]
PARAM_GROUPS = "param_groups"  # TE / apex FusedAdam: param_group["step"]
HYBRID = "hybrid"            # megatron's HybridDeviceOptimizer: per sub-optimizer

# Qualified class names (module.qualname), so the check needs neither TE nor apex imported.
FUSED_ADAM_CLASSES = {
    "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam": "Transformer Engine FusedAdam",
    "apex.optimizers.fused_adam.FusedAdam": "apex FusedAdam",
}
HYBRID_CLASS = "megatron.core.optimizer.cpu_offloading.hybrid_optimizer.HybridDeviceOptimizer"


class UnknownOptimizerError(HpcTrainError):
    pass


def _qualified_names(cls) -> list[str]:
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]


def step_location(inner) -> str:
    """Where ``inner`` (a torch optimizer under megatron's wrappers) keeps Adam's step."""
    import torch
    names = _qualified_names(type(inner))
    if HYBRID_CLASS in names:
        return HYBRID
    if any(n in FUSED_ADAM_CLASSES for n in names):
        return PARAM_GROUPS
    if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
        return STATE
    raise UnknownOptimizerError(
        f"optimizer class {names[0]} is not one hpctrain knows how to resume (it knows "
        f"torch.optim.Adam/AdamW, Transformer Engine's and apex's FusedAdam, and megatron's "
        f"HybridDeviceOptimizer); Adam's step count would be restored to the wrong place")


def describe(inner) -> str:
    """A short name for logs: 'Transformer Engine FusedAdam', 'torch.optim.AdamW', ..."""
    for n in _qualified_names(type(inner)):
        if n in FUSED_ADAM_CLASSES:
            return FUSED_ADAM_CLASSES[n]
    cls = type(inner)
    module = cls.__module__.split(".")[0]
    if module == "torch":
        fused = any(g.get("fused") for g in inner.param_groups if g["params"])
        return f"torch.optim.{cls.__name__}" + (" fused" if fused else "")
    return f"{cls.__module__}.{cls.__name__}"


def inner_optimizers(optimizer) -> list:
    """The torch optimizers inside megatron's wrappers (Chained -> Distributed/Float16/FP32)."""
    out = []
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(o, "optimizer", None)
        if inner is not None:
            out.append(inner)
    return out


def describe_optimizer(optimizer) -> str:
    """'DistributedOptimizer(Transformer Engine FusedAdam)' for the log and result.json."""
    parts = []
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(o, "optimizer", None)
        inside = describe(inner) if inner is not None else "no parameters"
        if inner is not None and step_location(inner) == HYBRID:
            inside += "[" + ", ".join(describe(s) for s in inner.sub_optimizers) + "]"
        parts.append(f"{type(o).__name__}({inside})")
    return " + ".join(dict.fromkeys(parts))


def _step_device(group, param):
    """Where torch's Adam wants a parameter's step: on its device when the group is fused or
    capturable (torch's own ``_init_group`` and ``load_state_dict`` rule), else the CPU."""
    return param.device if group.get("fused") or group.get("capturable") else "cpu"


def _set_in_state(inner, updates: int) -> None:
    import torch
    for group in inner.param_groups:
        for p in group["params"]:
            state = inner.state.get(p)
            if not state:
                continue   # never stepped: torch creates the step with the first update
            state["step"] = torch.tensor(float(updates), dtype=torch.float32,
                                         device=_step_device(group, p))


def set_fused_adam(optimizer, on: bool) -> None:
    """Make every torch Adam group fused (``on``) or not, with steps where torch wants them."""
    import torch
    if on:
        use_fused_adam(optimizer)
        return
    for inner in _leaf_optimizers(optimizer):
        if step_location(inner) != STATE:
            continue
        for group in inner.param_groups:
            if group.get("fused"):
                group["fused"] = None
                for p in group["params"]:
                    state = inner.state.get(p)
                    if state and isinstance(state.get("step"), torch.Tensor):
                        state["step"] = state["step"].to(device="cpu", dtype=torch.float32)


def use_fused_adam(optimizer) -> bool:
    """Switch megatron's torch AdamW (its fallback without TE or apex) to torch's fused
    implementation: ``get_megatron_optimizer`` builds ``torch.optim.AdamW`` with torch's default
    (foreach: about ten passes over the state and an fp32 temporary the size of the updated
    elements at every step); ``fused`` updates in one kernel, in place. torch keeps a fused
    group's step counts on the parameters' device, so steps that exist are moved there.
    Called after building and after every load (a checkpoint's param groups replace the
    flags). False when there is no torch Adam to switch (TE's or apex's FusedAdam)."""
    import torch
    switched = False
    for inner in _leaf_optimizers(optimizer):
        if step_location(inner) != STATE:
            continue
        for group in inner.param_groups:
            if not group["params"] or not all(p.dtype.is_floating_point for p in group["params"]):
                continue
            group["fused"], group["foreach"] = True, False
            switched = True
            for p in group["params"]:
                state = inner.state.get(p)
                if state and isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
    return switched


def fused_adam_in_use(optimizer) -> bool:
    return any(g.get("fused") for inner in _leaf_optimizers(optimizer)
               if step_location(inner) == STATE for g in inner.param_groups if g["params"])


def _set_in_groups(inner, updates: int) -> None:
    import torch
    for group in inner.param_groups:
        if not group["params"]:
            continue   # TE never counts empty groups (megatron aligns them the same way)
        old = group.get("step")
        if isinstance(old, torch.Tensor):          # FusedAdam(capturable=True)
            old.fill_(updates)
        else:
            group["step"] = int(updates)
    for state in inner.state.values():
        state.pop("step", None)                    # TE's state_dict() fails on it


def set_step_on(inner, updates: int) -> None:
    where = step_location(inner)
    if where == STATE:
        _set_in_state(inner, updates)
    elif where == PARAM_GROUPS:
        _set_in_groups(inner, updates)
    else:
        for group in inner.param_groups:
            group.pop("step", None)   # else copied over the sub-optimizers' counts every step
        for sub in inner.sub_optimizers:
            set_step_on(sub, updates)


def set_step(optimizer, updates: int) -> None:
    """Make Adam's step ``updates`` wherever each inner optimizer keeps it."""
    for inner in inner_optimizers(optimizer):
        set_step_on(inner, updates)


def read_steps(optimizer) -> set:
    """Every step count the optimizer holds (a test and a log check that they agree)."""
    steps = set()
    for inner in inner_optimizers(optimizer):
        subs = inner.sub_optimizers if step_location(inner) == HYBRID else [inner]
        for sub in subs:
            if step_location(sub) == STATE:
                steps |= {float(s["step"]) for s in sub.state.values() if "step" in s}
            else:
                steps |= {float(g["step"]) for g in sub.param_groups
                          if g["params"] and "step" in g}
    return steps


def _leaf_optimizers(optimizer) -> list:
    out = []
    for inner in inner_optimizers(optimizer):
        out.extend(inner.sub_optimizers if step_location(inner) == HYBRID else [inner])
    return out


def _converted(state_dict: dict, where: str, updates: int) -> dict:
    import torch
    state = {}
    for k, s in state_dict["state"].items():
        s = dict(s)
        if where == PARAM_GROUPS:
            s.pop("step", None)
        elif s and "step" not in s:
            s["step"] = torch.tensor(float(updates), dtype=torch.float32)
        state[k] = s
    return {**state_dict, "state": state}


@contextlib.contextmanager
def load_in_own_step_format(optimizer, updates: int):
    """While loading: each inner optimizer is handed its state dict in its own step format.

    A checkpoint written by the other kind crosses devices: megatron's non-distributed
    optimizers put a checkpoint's ``common_step`` back on every parameter before calling the
    inner ``load_state_dict``, so a checkpoint of torch's Adam (the CPU rehearsal) reaches TE's
    FusedAdam with ``state[p]["step"]``, which its ``load_state_dict`` cannot place; a FusedAdam
    checkpoint has no per-parameter step, without which torch's Adam refuses to load
    (``KeyError: 'step'``). The count itself is set afterwards by :func:`set_step`.
    """
    patched = []
    for inner in _leaf_optimizers(optimizer):
        where = step_location(inner)
        original = inner.load_state_dict
        own = vars(inner).get("load_state_dict")   # an instance attribute to put back, if any

        def load(state_dict, _original=original, _where=where):
            return _original(_converted(state_dict, _where, updates))

        inner.load_state_dict = load
        patched.append((inner, own))
    try:
        yield
    finally:
        for inner, own in patched:
            if own is None:
                del inner.load_state_dict   # back to the class's method
            else:
                inner.load_state_dict = own
