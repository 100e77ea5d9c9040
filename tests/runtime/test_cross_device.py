"""Checkpoints across layer implementations and devices (hpctrain.runtime.checkpoint.cross_device)."""

from __future__ import annotations

import json

import pytest

from tests.launch import Launch
from tests.runtime.conftest import _explain

pytestmark = pytest.mark.megatron


def test_checkpoint_without_extra_state_loads_and_a_missing_weight_is_refused(ws):
    """Real saves and loads on one rank: a model asking for ``_extra_state`` entries its
    checkpoint lacks loads (they keep their own values), as ``train.init_from`` too; a missing
    weight is refused before anything is read, naming it."""
    run = ws.new_run("cross-device", "single", train={"init_from": None})
    out = run.path / "probe.json"
    res = Launch(run.path, 1, module="tests.runtime.cross_device_probe",
                 args=[str(run.path), str(out)]).wait(300)
    assert res.codes == [0], _explain(res)
    got = json.loads(out.read_text())
    assert got["requested_extra_state"], "the local spec's linears ask for _extra_state"
    assert got["extra_state_load"] == {"step": 1, "weights_equal": True}
    assert got["init_from_weights_equal"] is True
    assert "lacks 1 model entries this run's layers need (decoder.final_layernorm.weight)" in \
        got["missing_weight"], got["missing_weight"]
    log = res.output(0)
    assert f"{len(got['requested_extra_state'])} _extra_state entries (Transformer Engine's FP8 " \
           f"metadata) absent from the checkpoint keep this model's fresh values" in log


def test_rng_states_are_restored_only_on_the_device_and_layout_that_saved_them():
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()
    from hpctrain.runtime import rng
    from hpctrain.runtime.checkpoint.cross_device import restore_rng_here
    cpu_state = rng.capture("cpu")
    assert restore_rng_here({"device": "cpu"}, cpu_state, "cpu", True) == (True, "")
    assert restore_rng_here({"device": "cpu"}, cpu_state, "cuda", True) == \
        (False, "saved on cpu, now cuda")
    assert restore_rng_here({}, cpu_state, "cpu", False) == (False, "layout changed")
    # states captured before the device was recorded: a CUDA state only on GPUs
    old = {k: v for k, v in cpu_state.items() if k != "device"}
    assert restore_rng_here({}, old, "cuda", True) == (False, "saved on cpu, now cuda")
    assert restore_rng_here({}, {**old, "cuda": object()}, "cuda", True) == (True, "")


def test_dp_reshardable_across_layer_implementations_is_refused_with_the_fix():
    from hpctrain.runtime.checkpoint.cross_device import check_resume
    from hpctrain.runtime.checkpoint.manager import CheckpointError
    saved = {"device": "cpu", "layers": {"transformer_impl": "local"}}
    check_resume("ck", saved, "local", True, "dp_reshardable")
    check_resume("ck", saved, "transformer_engine", True, "fully_reshardable")
    check_resume("ck", {}, "transformer_engine", False, "dp_reshardable")
    with pytest.raises(CheckpointError) as e:
        check_resume("ck", saved, "transformer_engine", True, "dp_reshardable")
    assert "saved with model.transformer_impl: local and stores the distributed optimizer as " \
           "dp_reshardable" in str(e.value)
    assert "Resume with model.transformer_impl: local, or start from its weights with " \
           "train.init_from" in str(e.value)


def test_initial_weights_are_built_on_the_jobs_layout_when_the_ranks_allow_it():
    from hpctrain.config import job_from_mapping
    from hpctrain.runtime.init_weights import export_layout
    from tests.runtime.helpers import job_mapping
    job = job_from_mapping(job_mapping("/d", "tp2pp2vpp2"), "job")
    assert export_layout(job, 4).describe() == "TP2×PP2×VPP2×DP1"
    assert export_layout(job, 8).describe() == "TP2×PP2×VPP2×DP2"
    assert export_layout(job, 1).describe() == "TP1×PP1×DP1"
    assert export_layout(job, 3).describe() == "TP1×PP1×DP3"


def test_initial_weights_too_large_for_one_gpu_are_refused_with_the_ranks_that_fit():
    from hpctrain.config import load_job
    from hpctrain.errors import HpcTrainError
    from hpctrain.runtime.init_weights import check_fits, export_layout, shard_bytes
    from tests.conftest import REPO
    job = load_job(REPO / "examples" / "llama2-7b.yaml")
    one = export_layout(job, 1)
    need = shard_bytes(job, one, "cuda")
    assert 12 * 2**30 < need < 14 * 2**30          # 6.7B parameters in bf16
    check_fits(job, one, 1, 80 * 2**30)            # fits an 80 GB GPU
    with pytest.raises(HpcTrainError) as e:
        check_fits(job, one, 1, 8 * 2**30)
    msg = str(e.value)
    assert msg.startswith(f"initial weights of {job.name}: {need / 2**30:.1f} GiB of bf16 "
                          f"weights per GPU on TP1×PP1×DP1 (1 rank(s)), but only 8.0 GiB of GPU "
                          f"memory is free; ")
    tp_pp = job.parallel.tensor_model_parallel_size * job.parallel.pipeline_model_parallel_size
    if tp_pp > 1:
        assert f"launch the export on a multiple of TP×PP = {tp_pp} ranks" in msg
        sharded = export_layout(job, tp_pp)
        assert shard_bytes(job, sharded, "cuda") < need / tp_pp * 1.5


def test_an_export_built_on_tp2_starts_a_single_process_run(ws):
    """The export on the job's TP2 layout (two ranks, each its shard), used by another layout."""
    run = ws.new_run("export-tp2", "tp2", train={"init_from": None})
    out = run.path / "init-tp2"
    res = Launch(run.path, 2, module="hpctrain.runtime.init_weights",
                 args=[str(run.path), str(out)]).wait(300)
    assert res.codes == [0, 0], _explain(res)
    assert "built on TP2×PP1×DP1" in res.output(0)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "model" and manifest["layout"]["tp"] == 2
    assert manifest["device"] == "cpu" and manifest["layers"]["transformer_impl"] == "local"
    trained, res2 = ws.train("from-tp2-export", "single", steps=3,
                             train={"init_from": str(out)})
    assert f"initial weights from {out}" in res2.output(0)
