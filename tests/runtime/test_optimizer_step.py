"""Adam's step on resume, for every optimizer class megatron-core may build.

torch's Adam and AdamW run for real. Transformer Engine's and apex's FusedAdam need CUDA and
are not installed here: their branch runs against stand-ins that reproduce exactly the
bookkeeping their sources show (quoted in each class), with the Adam update written out in
torch (the fused kernels' math, ``adam_w_mode=1``). None of these classes has run on a GPU
through these tests. Also: torch's fused AdamW switched on and off beside a FusedAdam, and
megatron's offloading optimizer (``HybridDeviceOptimizer``, a stand-in by its class name over
real parts).
"""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.megatron


def _torch():
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()   # megatron's FP32Optimizer puts its loss scale on "cuda"
    import torch
    return torch


class _FusedAdamBookkeeping:
    """The parts of TE's and apex's FusedAdam that decide where the step lives."""

    def _adam_update(self, group, p, state):
        torch = _torch()
        beta1, beta2 = group["betas"]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        g = p.grad
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step = group["step"]
        m_hat = m / (1 - beta1 ** step)
        v_hat = v / (1 - beta2 ** step)
        update = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
        p.sub_(group["lr"] * update)

    def step(self, closure=None):
        torch = _torch()
        with torch.no_grad():
            for group in self.param_groups:
                if len(group["params"]) == 0:
                    continue
                # TE fused_adam.py step() (apex's is the same without capturable):
                #     if "step" in group:
                #         group["step"] += 1 ...
                #     else:
                #         group["step"] = 1 ...
                if "step" in group:
                    group["step"] += 1
                else:
                    group["step"] = 1
                for p in group["params"]:
                    if p.grad is not None:
                        self._adam_update(group, p, self.state[p])


def _make_fused_class(module: str, strict_state_keys: bool):
    torch = _torch()

    class FusedAdam(_FusedAdamBookkeeping, torch.optim.Optimizer):
        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                     adam_w_mode=True, bias_correction=True):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                          bias_correction=bias_correction))
            self.adam_w_mode = 1 if adam_w_mode else 0
            self.name_to_dtype_map = {"exp_avg": torch.float32, "exp_avg_sq": torch.float32,
                                      "master_param": torch.float32}

        if strict_state_keys:
            # TE 2.x fused_adam.py:
            #     def state_dict(self):
            #         ... for name in v:
            #                 new_v[name] = self.get_unscaled_state(param, name)
            #     def get_unscaled_state(self, param, state_name):
            #         state = self.state[param]
            #         dtype = self.name_to_dtype_map[state_name]          <- KeyError on "step"
            #     def load_state_dict(self, state_dict):
            #         super().load_state_dict(state_dict) ...
            #             self.set_scaled_state(param, name, v[name].float())
            #     (set_scaled_state -> _initialize_state -> name_to_dtype_map[state_name])
            def get_unscaled_state(self, param, state_name):
                dtype = self.name_to_dtype_map[state_name]
                assert self.state[param][state_name].dtype == dtype
                return self.state[param][state_name]

            def set_scaled_state(self, param, state_name, unscaled_state):
                self.name_to_dtype_map[state_name]
                self.state[param][state_name] = unscaled_state.clone()

            def state_dict(self):
                sd = super().state_dict()
                params = [p for g in self.param_groups for p in g["params"]]
                for k, v in sd["state"].items():
                    sd["state"][k] = {name: self.get_unscaled_state(params[k], name) for name in v}
                return sd

            def load_state_dict(self, state_dict):
                super().load_state_dict(state_dict)
                params = [p for g in self.param_groups for p in g["params"]]
                for k, v in state_dict["state"].items():
                    self.state[params[k]] = {}
                    for name in v:
                        self.set_scaled_state(params[k], name, v[name].float())

    FusedAdam.__module__ = module
    FusedAdam.__qualname__ = "FusedAdam"
    return FusedAdam


def te_fused_adam():
    return _make_fused_class("transformer_engine.pytorch.optimizers.fused_adam", True)


def apex_fused_adam():
    # apex/optimizers/fused_adam.py: the same group["step"] counting, torch's default
    # state_dict/load_state_dict (any key is accepted)
    return _make_fused_class("apex.optimizers.fused_adam", False)


def torch_adamw():
    return _torch().optim.AdamW


def torch_adam():
    return _torch().optim.Adam


CLASSES = {"torch.optim.AdamW": torch_adamw, "torch.optim.Adam": torch_adam,
           "Transformer Engine FusedAdam": te_fused_adam, "apex FusedAdam": apex_fused_adam}
KW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _params(seed=0):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)),
            torch.nn.Parameter(torch.randn(7, generator=g))]


def _grads(step):
    torch = _torch()
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(5, 3, generator=g), torch.randn(7, generator=g)]


def _groups(params):
    """Two groups as megatron builds them: weights with decay, biases/norms without."""
    keys = dict(lr_mult=1.0, is_expert_parallel=False, is_decoupled_lr=False)
    return [{"params": [params[0]], "wd_mult": 1.0, **keys},
            {"params": [params[1]], "wd_mult": 0.0, "weight_decay": 0.0, **keys}]


def _wrapped(cls, params):
    """The inner optimizer in megatron-core's own FP32Optimizer wrapper."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import FP32Optimizer
    inner = cls(_groups(params), **KW)
    return FP32Optimizer(inner, OptimizerConfig(optimizer="adam", lr=KW["lr"]), lambda *a: None)


def _train(opt, params, steps):
    for s in steps:
        for p, g in zip(params, _grads(s)):
            p.grad = g.clone()
        opt.optimizer.step()


def _lose_the_step(sd):
    """What megatron's loads may leave behind: a count that is not the checkpoint's."""
    for group in sd["param_groups"]:
        if "step" in group:
            group["step"] = 0
    for state in sd["state"].values():
        if "step" in state:
            state["step"] = state["step"] * 0


@pytest.mark.parametrize("name", list(CLASSES))
def test_step_location_and_name(name):
    from hpctrain.runtime.checkpoint import optimizer_step as osx
    inner = CLASSES[name]()(_groups(_params()), **KW)
    expected = osx.STATE if name.startswith("torch") else osx.PARAM_GROUPS
    assert osx.step_location(inner) == expected
    assert osx.describe(inner) == name


def test_an_unknown_optimizer_class_is_refused_with_the_classes_it_knows():
    from hpctrain.runtime.checkpoint import optimizer_step as osx
    torch = _torch()
    with pytest.raises(osx.UnknownOptimizerError) as e:
        osx.step_location(torch.optim.SGD(_params(), lr=0.1))
    assert "torch.optim.sgd.SGD is not one hpctrain knows how to resume" in str(e.value)
    assert "FusedAdam" in str(e.value)


@pytest.mark.parametrize("name", list(CLASSES))
def test_resume_continues_bitwise_after_the_count_is_restored(name):
    """Uninterrupted 6 updates == 3 updates, save, a load that lost the step, set_step(3),
    3 more; and without set_step the weights differ (the test can fail)."""
    from hpctrain.runtime.checkpoint import optimizer_step as osx
    from hpctrain.runtime.checkpoint.state import load_optimizer_state
    torch = _torch()
    cls = CLASSES[name]()

    ref_params = _params()
    ref = _wrapped(cls, ref_params)
    _train(ref, ref_params, range(6))

    first_params = _params()
    first = _wrapped(cls, first_params)
    _train(first, first_params, range(3))
    saved = copy.deepcopy(first.state_dict())      # TE: fails if a per-parameter step is there
    _lose_the_step(saved)

    outcomes = {}
    for restore in (True, False):
        params = [torch.nn.Parameter(p.detach().clone()) for p in first_params]
        resumed = _wrapped(cls, params)
        if restore:
            load_optimizer_state(resumed, copy.deepcopy(saved), updates=3)
            assert osx.read_steps(resumed) == {3.0}
            resumed.state_dict()                    # saving after the resume works
        else:
            resumed.load_state_dict(copy.deepcopy(saved))
        _train(resumed, params, range(3, 6))
        outcomes[restore] = all(torch.equal(a, b) for a, b in zip(params, ref_params))
        if restore:
            assert osx.read_steps(resumed) == {6.0}
            resumed.state_dict()                    # and a save after more steps
    assert outcomes == {True: True, False: False}


def test_fused_adam_keeps_no_per_parameter_step_and_te_state_dict_would_fail_on_one():
    from hpctrain.runtime.checkpoint import optimizer_step as osx
    params = _params()
    opt = _wrapped(te_fused_adam(), params)
    _train(opt, params, range(2))
    first = next(iter(opt.optimizer.state.values()))
    first["step"] = _torch().tensor(2.0)        # what the old per-parameter restore planted
    with pytest.raises(KeyError):
        opt.state_dict()                         # the failure every save after a resume hit
    osx.set_step(opt, 2)
    assert all("step" not in s for s in opt.optimizer.state.values())
    assert [g["step"] for g in opt.optimizer.param_groups] == [2, 2]
    opt.state_dict()


def test_the_distributed_optimizers_load_leaves_each_parameters_step_as_it_was():
    """megatron-core's fully-reshardable load sets each parameter's state through
    ``_set_main_param_and_optimizer_states``, never given Adam's step (fix 2): hpctrain's
    wrapper keeps a per-parameter step (torch's Adam) through it, and adds none where the
    optimizer keeps none (a FusedAdam, whose state_dict fails on one)."""
    from types import SimpleNamespace

    from hpctrain.runtime.checkpoint.state import _step_set_aside
    torch = _torch()
    kept, fused = object(), object()          # two model parameters
    main = [torch.zeros(2), torch.zeros(2)]
    state = {main[0]: {"exp_avg": torch.zeros(2), "step": torch.tensor(7.0)},   # by identity
             main[1]: {"exp_avg": torch.zeros(2)}}

    def loader_sets(model_param, tensors):     # as megatron-core's: every key it was given
        group, order = o.model_param_group_index_map[model_param]
        target = o.optimizer.state[o.optimizer.param_groups[group]["params"][order]]
        target.update(tensors)
        assert "step" not in target, "the loader saw Adam's step"

    o = SimpleNamespace(model_param_group_index_map={kept: (0, 0), fused: (0, 1)},
                        optimizer=SimpleNamespace(state=state,
                                                  param_groups=[{"params": main}]),
                        _set_main_param_and_optimizer_states=loader_sets)
    original, setter = _step_set_aside(o)
    assert original is loader_sets
    setter(kept, {"exp_avg": torch.ones(2)})
    setter(fused, {"exp_avg": torch.ones(2)})
    assert float(state[main[0]]["step"]) == 7.0
    assert torch.equal(state[main[0]]["exp_avg"], torch.ones(2))
    assert "step" not in state[main[1]]


def test_a_cpu_checkpoint_loads_into_fused_adam_and_a_fused_one_into_torch_adam():
    """Per-parameter steps (torch, the CPU rehearsal) into FusedAdam, and group steps back."""
    from hpctrain.runtime.checkpoint import optimizer_step as osx
    from hpctrain.runtime.checkpoint.state import load_optimizer_state

    cpu_params = _params()
    cpu = _wrapped(torch_adamw(), cpu_params)
    _train(cpu, cpu_params, range(4))
    cpu_sd = cpu.state_dict()
    assert all("step" in s for s in cpu_sd["state"].values())

    gpu = _wrapped(te_fused_adam(), _params())
    with pytest.raises(KeyError):
        gpu.load_state_dict(copy.deepcopy(cpu_sd))      # TE's load_state_dict on "step"
    gpu = _wrapped(te_fused_adam(), _params())
    load_optimizer_state(gpu, copy.deepcopy(cpu_sd), updates=4)
    assert osx.read_steps(gpu) == {4.0}
    _train(gpu, [p for g in gpu.optimizer.param_groups for p in g["params"]], range(4, 5))
    assert osx.read_steps(gpu) == {5.0}
    gpu_sd = gpu.state_dict()
    assert all("step" not in s for s in gpu_sd["state"].values())

    back = _wrapped(torch_adamw(), _params())
    load_optimizer_state(back, copy.deepcopy(gpu_sd), updates=5)
    _train(back, [p for g in back.optimizer.param_groups for p in g["params"]], range(5, 6))
    assert osx.read_steps(back) == {6.0}
    # the load's own format was lent for the load only: the class's method is back
    assert "load_state_dict" not in vars(back.optimizer)


def test_a_parameter_never_updated_gets_no_step_of_its_own_when_a_checkpoint_is_converted():
    """A FusedAdam checkpoint into torch's Adam: every parameter with Adam state gets the count,
    one without state stays without (torch creates its moments and count at its first
    update; a lone count would make torch skip creating the moments)."""
    from hpctrain.runtime.checkpoint import optimizer_step as osx
    torch = _torch()
    saved = {"state": {0: {"exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}, 1: {}},
             "param_groups": [{"params": [0, 1], "step": 7}]}
    got = osx._converted(saved, osx.STATE, 7)
    assert float(got["state"][0]["step"]) == 7.0 and got["state"][1] == {}
    assert "step" not in saved["state"][0]                 # the checkpoint's dict is not changed
    grouped = osx._converted({**saved, "state": {0: {**saved["state"][0], "step": 3}}},
                             osx.PARAM_GROUPS, 7)
    assert "step" not in grouped["state"][0]


def test_describe_optimizer_names_wrapper_and_inner_class():
    from hpctrain.runtime.checkpoint import optimizer_step as osx
    opt = _wrapped(te_fused_adam(), _params())
    assert osx.describe_optimizer(opt) == "FP32Optimizer(Transformer Engine FusedAdam)"
    assert osx.describe_optimizer(_wrapped(torch_adamw(), _params())) == \
        "FP32Optimizer(torch.optim.AdamW)"


def _hybrid_class():
    """megatron's HybridDeviceOptimizer as optimizer_step sees it: its own param groups (which
    it copies into its sub-optimizers before every step) over a torch AdamW (the CPU part) and
    a FusedAdam (the GPU part)."""
    torch = _torch()

    class HybridDeviceOptimizer(torch.optim.Optimizer):
        def __init__(self, params, sub_optimizers):
            super().__init__(params, dict(lr=KW["lr"]))
            self.sub_optimizers = sub_optimizers

    HybridDeviceOptimizer.__module__ = "megatron.core.optimizer.cpu_offloading.hybrid_optimizer"
    HybridDeviceOptimizer.__qualname__ = "HybridDeviceOptimizer"
    return HybridDeviceOptimizer


def test_an_offloaded_optimizers_parts_each_get_the_count_where_they_keep_it():
    from types import SimpleNamespace

    from hpctrain.runtime.checkpoint import optimizer_step as ost
    params = _params()
    cpu_part = torch_adamw()(_groups(params)[:1], **KW)
    gpu_part = te_fused_adam()(_groups(params)[1:], **KW)
    for part in (cpu_part, gpu_part):
        for p, g in zip(params, _grads(0)):
            p.grad = g.clone()
        part.step()
    hybrid = _hybrid_class()(params, [cpu_part, gpu_part])
    hybrid.param_groups[0]["step"] = 1             # left in its own groups: would be copied over
    wrapped = SimpleNamespace(optimizer=hybrid)
    assert ost.step_location(hybrid) == ost.HYBRID
    ost.set_step(wrapped, 9)
    assert "step" not in hybrid.param_groups[0]
    assert ost.read_steps(wrapped) == {9.0}
    assert float(cpu_part.state[params[0]]["step"]) == 9.0 and gpu_part.param_groups[0]["step"] == 9
    assert ost.describe_optimizer(wrapped) == (
        "SimpleNamespace(megatron.core.optimizer.cpu_offloading.hybrid_optimizer."
        "HybridDeviceOptimizer[torch.optim.AdamW, Transformer Engine FusedAdam])")


def test_torch_adam_is_switched_to_its_fused_kernel_and_back_and_fused_adam_is_left_alone():
    """A chain of a FusedAdam and a torch AdamW, as a model with two parameter kinds may have:
    only the torch groups are switched (their step counts moved where torch wants them), an
    empty group is left as it is, and switching back puts the counts on the CPU again."""
    from types import SimpleNamespace

    from hpctrain.runtime.checkpoint import optimizer_step as ost
    torch = _torch()
    params = _params()
    fused_part = te_fused_adam()(_groups(params)[:1], **KW)
    torch_part = torch_adamw()(_groups(params)[1:] + [{"params": []}], **KW)
    for p, g in zip(params, _grads(0)):
        p.grad = g.clone()
    torch_part.step()
    chain = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=fused_part),
                                                SimpleNamespace(optimizer=torch_part)])
    assert not ost.fused_adam_in_use(chain)
    assert ost.use_fused_adam(chain) is True and ost.fused_adam_in_use(chain)
    group, empty = torch_part.param_groups
    assert (group["fused"], group["foreach"]) == (True, False)
    assert "fused" not in fused_part.param_groups[0] and empty.get("fused") is None
    step = torch_part.state[params[1]]["step"]
    assert step.dtype == torch.float32 and step.device == params[1].device
    ost.set_fused_adam(chain, False)
    assert group["fused"] is None and not ost.fused_adam_in_use(chain)
    assert torch_part.state[params[1]]["step"].device.type == "cpu"
    ost.set_fused_adam(chain, True)
    assert group["fused"] is True
    only_fused = SimpleNamespace(optimizer=fused_part)
    assert ost.use_fused_adam(only_fused) is False and not ost.fused_adam_in_use(only_fused)
