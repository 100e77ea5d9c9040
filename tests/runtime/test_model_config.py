"""megatron-core's TransformerConfig as the runtime builds it, for the GPU path and the CPU
rehearsal (construction runs megatron's own validation; no process group is needed)."""

from __future__ import annotations

import pytest

from hpctrain.config import job_from_mapping
from hpctrain.config.layout import Layout
from tests.runtime.helpers import job_mapping

pytestmark = pytest.mark.megatron


def _config(device, layout=Layout(2, 2, 2, 1, 2, 16), **model):
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()
    from hpctrain.runtime.model import transformer_config
    # no Transformer Engine here: the GPU configs use the local spec (test_layers.py: TE's)
    model = {"transformer_impl": "local", **model}
    job = job_from_mapping(job_mapping("/nonexistent", "tp2pp2vpp2", model=model,
                                       parallel={"sequence_parallel": True},
                                       train={"precision": "bf16"}), "job")
    notes = []
    return transformer_config(job, layout, device, notes), notes


@pytest.mark.parametrize("model", [
    {},
    {"activation": "swiglu", "normalization": "RMSNorm", "position_embedding_type": "rope",
     "num_query_groups": 2, "add_bias_linear": False, "untie_embeddings_and_output_weights": True},
    {"add_bias_linear": False},
])
def test_gpu_and_cpu_configs(model):
    import torch
    gpu, gpu_notes = _config("cuda", **model)
    assert gpu.bf16 and gpu.params_dtype == torch.bfloat16 and gpu.pipeline_dtype == torch.bfloat16
    assert gpu.overlap_p2p_comm and not gpu.batch_p2p_comm   # interleaved: overlapped p2p
    assert not gpu.use_cpu_initialization                  # weights drawn on the device
    assert gpu.virtual_pipeline_model_parallel_size == 2
    cpu, cpu_notes = _config("cpu", **model)
    assert not cpu.bf16 and cpu.params_dtype == torch.float32
    assert not cpu.sequence_parallel and not cpu.bias_activation_fusion
    assert any("precision fp32 on CPU" in n for n in cpu_notes)
    assert any("sequence parallelism off" in n for n in cpu_notes)
    swiglu = model.get("activation") == "swiglu"
    assert cpu.gated_linear_unit == swiglu and cpu.normalization == model.get("normalization", "LayerNorm")
    assert cpu.num_query_groups == model.get("num_query_groups", 4)


def test_p2p_batched_without_a_virtual_pipeline_overlapped_with_one_on_both_devices():
    for device in ("cuda", "cpu"):
        plain, _ = _config(device, layout=Layout(2, 2, None, 1, 2, 16))
        assert plain.batch_p2p_comm and not plain.overlap_p2p_comm
        interleaved, _ = _config(device)
        assert interleaved.overlap_p2p_comm and not interleaved.batch_p2p_comm
        assert not interleaved.use_cpu_initialization
