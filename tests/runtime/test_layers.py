"""The layer implementation a rank builds (hpctrain.runtime.layers): Transformer Engine on CUDA
by default with no silent fallback, the local spec with only importable fusions, CPU always
local. Transformer Engine and apex are not installed on this machine, so the CUDA branches
are checked here for what a node without them gets; no GPU ran these tests."""

from __future__ import annotations

import importlib.util

import pytest

from hpctrain.config import job_from_mapping, profile_from_mapping
from hpctrain.config.layout import Layout
from tests.runtime.helpers import job_mapping, local_profile

LAYOUT = Layout(1, 1, None, 1, 2, 16)


def _job(**model):
    return job_from_mapping(job_mapping("/nonexistent", "single", model=model,
                                        train={"precision": "bf16"}), "job")


def _fresh_choice():
    from hpctrain.runtime import layers
    layers._cache.clear()
    return layers


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None,
                    reason="this node has Transformer Engine")
def test_cuda_without_transformer_engine_stops_with_the_import_error_and_the_fix():
    layers = _fresh_choice()
    with pytest.raises(layers.LayerImplError) as e:
        layers.choose(_job(), "cuda")
    msg = str(e.value)
    assert msg.startswith("model.transformer_impl: transformer_engine, but Transformer Engine "
                          "cannot be imported on this node (ModuleNotFoundError: No module named "
                          "'transformer_engine'); install Transformer Engine")
    assert msg.endswith("or set model.transformer_impl: local (megatron-core's own layers: "
                        "unfused attention, slower)")
    assert "\n" not in msg


@pytest.mark.megatron
def test_the_model_is_not_built_when_transformer_engine_is_missing():
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()
    layers = _fresh_choice()
    from hpctrain.runtime.model import transformer_config
    if importlib.util.find_spec("transformer_engine") is None:
        with pytest.raises(layers.LayerImplError):
            transformer_config(_job(), LAYOUT, "cuda")


@pytest.mark.megatron
def test_local_spec_on_cuda_enables_only_the_fusions_whose_kernels_import():
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()
    layers = _fresh_choice()
    from hpctrain.runtime.model import transformer_config
    impl = layers.choose(_job(transformer_impl="local"), "cuda")
    apex_softmax = all(importlib.util.find_spec(k) for k in layers.APEX_SOFTMAX_KERNELS)
    apex_wgrad = importlib.util.find_spec(layers.APEX_WGRAD_KERNEL) is not None
    assert impl.name == "local" and impl.attention_backend == "local"
    assert impl.fusions == {"masked_softmax_fusion": apex_softmax, "bias_activation_fusion": True,
                            "bias_dropout_fusion": True, "gradient_accumulation_fusion": apex_wgrad,
                            "apply_rope_fusion": False,        # learned positions here
                            "cross_entropy_loss_fusion": True}  # bf16
    assert impl.core_attention == "torch_sdpa"
    assert impl.sdpa_kernels == ("flash", "cudnn", "efficient")
    assert any("with torch's fused attention (kernels tried in order: flash,cudnn,efficient)"
               in n for n in impl.notes)
    unfused = layers.choose(_job(transformer_impl="local", attention_backend="local"), "cuda")
    assert unfused.core_attention == "megatron_unfused"
    assert any("unfused attention" in n for n in unfused.notes)
    if not apex_softmax:
        assert any(n.startswith("masked softmax fusion off: apex's softmax kernels are not "
                                "importable") for n in impl.notes)
    notes = []
    config = transformer_config(_job(transformer_impl="local"), LAYOUT, "cuda", notes)
    assert config.transformer_impl == "local"
    assert config.masked_softmax_fusion is apex_softmax
    assert config.gradient_accumulation_fusion is apex_wgrad
    assert config.bias_dropout_fusion and config.bias_activation_fusion
    assert config.attention_backend.name == "local"
    assert notes[:len(impl.notes)] == list(impl.notes)
    assert impl.describe().startswith("layers local, attention torch sdpa "
                                      "[flash,cudnn,efficient], fusions ")
    assert unfused.describe().startswith("layers local, attention megatron unfused, fusions ")
    spec = layers.layer_spec(_job(transformer_impl="local"), impl)
    core = spec.submodules.self_attention.submodules.core_attention
    from hpctrain.runtime.fused_attention import TorchFusedAttention
    assert core.module is TorchFusedAttention and len(core.params["kernels"]) == 3
    unfused_spec = layers.layer_spec(_job(transformer_impl="local"), unfused)
    assert unfused_spec.submodules.self_attention.submodules.core_attention.__name__ == \
        "DotProductAttention"


def test_deterministic_mode_keeps_cudnn_attention_out():
    layers = _fresh_choice()
    job = job_from_mapping(job_mapping("/nonexistent", "single", model={"transformer_impl": "local"},
                                       train={"precision": "bf16", "deterministic_mode": True}),
                           "job")
    assert layers.choose(job, "cuda").sdpa_kernels == ("flash", "efficient")
    fused = job_from_mapping(job_mapping("/nonexistent", "single", model={
        "transformer_impl": "local", "attention_backend": "fused"}, train={
        "precision": "bf16", "deterministic_mode": True}), "job")
    with pytest.raises(layers.LayerImplError, match="cuDNN's fused attention has no "
                                                    "deterministic backward"):
        layers.choose(fused, "cuda")


def test_cpu_always_runs_the_local_spec_and_says_so():
    layers = _fresh_choice()
    impl = layers.choose(_job(), "cpu")
    assert impl.name == "local" and not any(impl.fusions.values())
    assert impl.notes == ("layers: megatron-core's local spec on CPU (the job's "
                          "model.transformer_impl: transformer_engine needs CUDA; GPUs will run "
                          "Transformer Engine)",)
    assert layers.choose(_job(transformer_impl="local"), "cpu").notes == ()
    assert impl.record() == {"transformer_impl": "local", "attention_backend": "local",
                             "core_attention": "torch_sdpa", "sdpa_kernels": ["flash", "math"],
                             "fusions": [], "transformer_engine": None}
    kept = layers.choose(_job(attention_backend="unfused"), "cpu")
    assert kept.core_attention == "megatron_unfused" and kept.sdpa_kernels == ()


def test_transformer_engine_with_the_local_attention_backend_is_refused():
    layers = _fresh_choice()
    with pytest.raises(layers.LayerImplError) as e:
        layers.choose(_job(attention_backend="local"), "cuda")
    assert str(e.value) == ("model.attention_backend: local is megatron-core's unfused attention "
                            "of the local layer spec; with Transformer Engine use auto, flash, "
                            "fused or unfused, or set model.transformer_impl: local")


def test_an_unknown_transformer_impl_is_a_config_error_naming_the_choices():
    from hpctrain.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        _job(transformer_impl="te")
    assert "model.transformer_impl" in str(e.value)
    assert "transformer_engine" in str(e.value) and "local" in str(e.value)


def _cuda_profile(**container):
    data = local_profile(1)
    data["node"]["device"] = "cuda"
    if container:
        data["container"] = container
    return profile_from_mapping(data, "p.yaml", "p")


def test_validate_and_submit_warn_without_importing_torch():
    from hpctrain.runtime.layers import launch_warnings
    cpu = profile_from_mapping(local_profile(1), "p.yaml", "p")
    assert launch_warnings(_job(), cpu) == []
    assert launch_warnings(_job(transformer_impl="local"), _cuda_profile()) == []
    assert launch_warnings(_job(transformer_impl="local", attention_backend="local"),
                           _cuda_profile()) == [
        "model.transformer_impl: local with attention_backend: local on GPUs runs "
        "megatron-core's unfused attention (its memory grows with the square of the sequence); "
        "auto uses torch's fused kernels"]
    te_here = importlib.util.find_spec("transformer_engine") is not None
    warned = launch_warnings(_job(), _cuda_profile())
    assert (warned == []) == te_here
    if not te_here:
        assert warned[0].startswith("Transformer Engine is not installed in this Python "
                                    "environment; the ranks need it on the nodes")
    # a container brings its own software: nothing to say from here
    assert launch_warnings(_job(), _cuda_profile(image="nvcr.io#nvidia/pytorch:25.11-py3")) == []


def test_the_cli_prints_the_warning_and_stays_light(tmp_path):
    from tests.conftest import hpctrain
    import yaml
    job = job_mapping(str(tmp_path / "data"), "single", model={"transformer_impl": "local",
                                                                "attention_backend": "local"})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    prof = local_profile(1)
    prof["node"]["device"] = "cuda"
    prof["name"] = "gpu-box"
    (tmp_path / "gpu-box.yaml").write_text(yaml.safe_dump(prof))
    proc = hpctrain("validate", str(tmp_path / "job.yaml"), "--profile",
                    str(tmp_path / "gpu-box.yaml"))
    assert proc.returncode == 0, proc.stderr
    assert "warning: model.transformer_impl: local with attention_backend: local on GPUs runs " \
           "megatron-core's unfused attention" in proc.stderr


def test_the_planner_counts_the_local_specs_attention_scores():
    from hpctrain.model_shape import ModelShape
    assert not ModelShape.from_job(_job()).attention_stores_scores            # TE, auto
    assert not ModelShape.from_job(_job(transformer_impl="local")).attention_stores_scores
    assert ModelShape.from_job(_job(transformer_impl="local",
                                    attention_backend="local")).attention_stores_scores
    assert ModelShape.from_job(_job(attention_backend="unfused")).attention_stores_scores
