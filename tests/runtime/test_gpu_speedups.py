"""Megatron-LM's speedups that run without Transformer Engine or apex (hpctrain.runtime.layers
``_with_speedups``, .rope, model.py): which are on where, and the CPU runs of the fused code
against megatron-core's unfused code (torch.compile'd RoPE, the native fused cross entropy in
bf16). torch's fused AdamW runs in every CPU training test (train.fused_adam defaults to
true; torch has a CPU kernel), its resumes bitwise included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config import job_from_mapping
from hpctrain.identity import free_port
from tests.runtime.helpers import job_mapping

PROBE = Path(__file__).with_name("fusions_probe.py")


def _job(model=None, **train):
    m = {"transformer_impl": "local", "position_embedding_type": "rope", **(model or {})}
    return job_from_mapping(job_mapping("/nonexistent", "single", model=m,
                                        train={"precision": "bf16", **train}), "job")


def _choose(job, device="cuda"):
    from hpctrain.runtime import layers
    layers._cache.clear()
    return layers.choose(job, device).fusions


def test_which_speedups_are_on_where():
    on = _choose(_job())
    assert on["apply_rope_fusion"] and on["cross_entropy_loss_fusion"]
    assert not _choose(_job({"apply_rope_fusion": False}))["apply_rope_fusion"]
    assert not _choose(_job({"position_embedding_type": "learned_absolute"}))["apply_rope_fusion"]
    # the fused loss's gradient is bf16: only bf16 training; never in deterministic mode
    assert not _choose(_job(precision="fp16"))["cross_entropy_loss_fusion"]
    assert not _choose(_job(deterministic_mode=True))["cross_entropy_loss_fusion"]
    assert not _choose(_job({"cross_entropy_loss_fusion": False}))["cross_entropy_loss_fusion"]
    cpu = _choose(_job(), "cpu")
    assert not cpu["apply_rope_fusion"] and "cross_entropy_loss_fusion" not in cpu


@pytest.mark.megatron
def test_the_megatron_config_gets_them_on_gpus_only():
    from hpctrain.config.layout import Layout
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()
    from hpctrain.runtime.model import transformer_config
    layout = Layout(1, 2, None, 1, 2, 16)
    notes = []
    gpu = transformer_config(_job(), layout, "cuda", notes)
    assert gpu.apply_rope_fusion and gpu.cross_entropy_loss_fusion
    assert gpu.cross_entropy_fusion_impl == "native" and gpu.deallocate_pipeline_outputs
    assert any("RoPE compiled by torch.compile" in n for n in notes)
    off = transformer_config(job_from_mapping(
        job_mapping("/nonexistent", "single", model={"transformer_impl": "local"},
                    parallel={"deallocate_pipeline_outputs": False},
                    train={"precision": "bf16"}), "job"), layout, "cuda")
    assert not off.deallocate_pipeline_outputs
    cpu = transformer_config(_job(), layout, "cpu")
    assert not (cpu.apply_rope_fusion or cpu.cross_entropy_loss_fusion
                or cpu.deallocate_pipeline_outputs)


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fusions") / "out.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MASTER_PORT": str(free_port("127.0.0.1"))}
    proc = subprocess.run([sys.executable, str(PROBE), str(out)], capture_output=True,
                          text=True, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.megatron
def test_compiled_rope_computes_megatrons_rope(probed):
    rope = probed["rope"]
    assert rope["whose"] == "torch.compile" and rope["was_missing"]
    assert rope["float32"]["forward"] < 1e-5 and rope["float32"]["backward"] < 1e-5
    # one kernel rounds to bf16 once where the unfused ops round after each: one bf16 step
    # at the magnitudes here (|x| < 8)
    assert rope["bfloat16"]["forward"] <= 2 ** -5 and rope["bfloat16"]["backward"] <= 2 ** -5


@pytest.mark.megatron
def test_native_fused_cross_entropy_matches_the_unfused_one_in_bf16(probed):
    ce = probed["cross_entropy"]
    assert ce["loss"] < 1e-5 and ce["grad"] == 0.0
    assert ce["grad_dtypes"] == ["torch.bfloat16", "torch.bfloat16"]
