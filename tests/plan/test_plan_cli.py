"""`hpctrain plan` and `check_fits` as a user and `hpctrain submit` see them."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.config import load_job, load_profile
from hpctrain.errors import ConfigError
from hpctrain.planner import check_fits
from tests.conftest import REPO

LLAMA = str(REPO / "examples" / "llama2-7b.yaml")
TINY = str(REPO / "examples" / "tiny.yaml")
CONTRACT_LAYOUT_KEYS = {
    "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "data_parallel_size", "micro_batch_size",
    "num_microbatches", "sequence_parallel", "recompute", "memory_bytes_per_gpu",
    "pipeline_bubble_fraction", "model_flops_per_step", "step_time_s", "mfu", "fits"}
MEMORY_KEYS = {"weights", "gradients", "optimizer", "activations", "optimizer_step", "buffers",
               "itemized", "allowance", "total"}


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def llama_plan() -> dict:
    res = run("plan", LLAMA, "--profile", "h100-ib-pyxis", "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_json_contract_and_ranking(llama_plan):
    data = llama_plan
    assert data["parameters"]["total"] == 6_738_415_616
    assert data["parameters"]["most_loaded_rank"] < data["parameters"]["total"]
    layouts = data["layouts"]
    assert layouts and all(CONTRACT_LAYOUT_KEYS <= set(lay) for lay in layouts)
    assert all(MEMORY_KEYS <= set(lay["memory_bytes_per_gpu"]) for lay in layouts)
    assert all(set(r) == {"layout", "reasons"} and r["reasons"] for r in data["rejected"])
    fitting = [lay for lay in layouts if lay["fits"]]
    assert fitting and layouts[:len(fitting)] == fitting          # those that fit come first
    times = [lay["step_time_s"] for lay in fitting]
    assert times == sorted(times)
    limit = data["gpu_memory_bytes"]
    for lay in layouts:
        mem = lay["memory_bytes_per_gpu"]
        assert mem["itemized"] == (mem["weights"] + mem["gradients"] + mem["optimizer"]
                                   + max(mem["activations"], mem["optimizer_step"])
                                   + mem["buffers"])
        assert mem["total"] == mem["itemized"] + mem["allowance"]
        assert lay["training_fits"] == (mem["total"] <= limit)
        save = lay["checkpoint_save"]
        assert save["optimizer_format"] in ("fully_reshardable", "dp_reshardable")
        assert lay["fits"] == (mem["total"] <= limit and save["fits"] is not False)
        assert mem["total"] == max(s["total"] for s in lay["memory_bytes_per_pipeline_rank"])
        assert lay["tensor_model_parallel_size"] <= 8                 # TP stays in a node
        assert (lay["tensor_model_parallel_size"] * lay["pipeline_model_parallel_size"]
                * lay["data_parallel_size"]) == 128
        assert 0 < lay["mfu"] < 1
    assert sum(lay["job_layout"] for lay in layouts) == 1


def test_more_sharding_means_less_memory_per_gpu(llama_plan):
    def total(tp, pp, sp=True, rec="selective"):
        (lay,) = [x for x in llama_plan["layouts"] if x["tensor_model_parallel_size"] == tp
                  and x["pipeline_model_parallel_size"] == pp and x["micro_batch_size"] == 1
                  and x["virtual_pipeline_model_parallel_size"] is None
                  and x["sequence_parallel"] == sp and x["recompute"] == rec]
        return lay["memory_bytes_per_gpu"]
    assert total(4, 1)["weights"] < total(2, 1)["weights"]
    assert total(2, 1, sp=True)["activations"] < total(2, 1, sp=False)["activations"]
    assert total(2, 1, rec="full")["activations"] < total(2, 1, rec="selective")["activations"]
    # the job uses flash attention: no scores are stored, so selective recompute saves only
    # the kernel's fp32 log-sum-exp (a·s per sequence and layer)
    kept = total(2, 1, rec=None)["activations"]
    assert 0 < kept - total(2, 1, rec="selective")["activations"] < kept / 100


def test_gpus_without_a_profile_leaves_fit_and_time_unknown():
    res = run("plan", LLAMA, "--gpus", "16", "--json")
    assert res.exit_code == 0, res.output
    layouts = json.loads(res.output)["layouts"]
    assert {lay["fits"] for lay in layouts} == {None}
    assert {lay["step_time_s"] for lay in layouts} == {None}
    totals = [lay["memory_bytes_per_gpu"]["total"] for lay in layouts]
    assert totals == sorted(totals)


def test_table_marks_the_jobs_layout_and_explains_the_best():
    res = run("plan", LLAMA, "--profile", "h100-ib-pyxis", "--top", "3")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Parameters: 6,738,415,616" in out
    assert "* the job's own layout" in out and "TP2×PP1×DP64" in out
    assert "Best:" in out and "activations" in out and "Assumptions:" in out


def test_pinned_invalid_layout_lists_every_reason():
    res = run("plan", LLAMA, "--profile", "h100-ib-pyxis", "--tp", "3")
    assert res.exit_code == 2
    assert "TP3×PP1 is not a valid layout on 128 GPUs" in res.output
    for reason in ("num_attention_heads (32) is not divisible by TP (3)",
                   "ffn_hidden_size (11008) is not divisible by TP (3)",
                   "TP (3) does not divide the GPUs per node (8)"):
        assert reason in res.output
    assert res.output.count("\n") == 1                      # one line
    res = run("plan", LLAMA, "--profile", "h100-ib-pyxis", "--tp", "3", "--json")
    assert res.exit_code == 2
    data = json.loads(res.output)
    assert data["layouts"] == [] and len(data["rejected"][0]["reasons"]) >= 3


def test_pinned_layout_that_does_not_fit_is_explained_with_an_alternative():
    res = run("plan", LLAMA, "--profile", "h100-ib-pyxis", "--nodes", "1", "--tp", "1",
              "--no-sequence-parallel", "--recompute-granularity", "none",
              "--micro-batch-size", "4")
    assert res.exit_code == 0, res.output
    assert "TP1×PP1×DP8 mbs 4 no recompute: does NOT fit in 80 GiB per GPU" in res.output
    assert "the fastest layout that fits:" in res.output
    res = run("plan", LLAMA, "--profile", "h100-ib-pyxis", "--tp", "4", "--pp", "2", "--json")
    (lay,) = json.loads(res.output)["layouts"]
    assert (lay["tensor_model_parallel_size"], lay["pipeline_model_parallel_size"],
            lay["data_parallel_size"]) == (4, 2, 16)
    assert len(lay["memory_bytes_per_pipeline_rank"]) == 2


@pytest.mark.parametrize("args, message", [
    (["--gpus", "8", "--nodes", "2"], "--nodes and --gpus both given"),
    (["--profile", "h100-ib-pyxis", "--gpus", "12"], "--gpus: 12 is not a whole number of nodes"),
    (["--profile", "no-such-profile"], "unknown profile 'no-such-profile'"),
])
def test_bad_options_are_one_line_usage_errors(args, message):
    res = run("plan", LLAMA, *args)
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output


def test_bad_job_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(TINY).read().replace("hidden_size: 128", "hidden_size: big"))
    res = run("plan", str(bad))
    assert res.exit_code == 2
    assert "model.hidden_size" in res.output


def test_check_fits_for_submit():
    job, profile = load_job(LLAMA), load_profile("h100-ib-pyxis")
    ok = check_fits(job, profile)
    assert ok.fits is True and ok.plan.is_job_layout and "fits in 80 GiB" in ok.message
    single = dataclasses.replace(
        job, parallel=dataclasses.replace(job.parallel, tensor_model_parallel_size=1,
                                          sequence_parallel=False),
        batch=dataclasses.replace(job.batch, micro_batch_size=4))
    bad = check_fits(single, profile.with_nodes(1))
    assert bad.fits is False and "does NOT fit in 80 GiB" in bad.message
    assert bad.best is not None and bad.best.fits
    assert f"parallel.tensor_model_parallel_size: {bad.best.layout.tensor_model_parallel_size}" \
        in bad.message
    unknown = check_fits(load_job(TINY), load_profile("dev-slurm"))
    assert unknown.fits is None and "gpu_memory_gb" in unknown.message
    with pytest.raises(ConfigError, match="tensor_model_parallel_size"):
        check_fits(dataclasses.replace(job, parallel=dataclasses.replace(
            job.parallel, tensor_model_parallel_size=3)), profile)


def test_plan_imports_no_torch():
    code = ("import sys; from hpctrain.cli import main\n"
            "try:\n    main(['plan', %r, '--profile', 'h100-ib-pyxis', '--json'])\n"
            "except SystemExit:\n    pass\n"
            "assert not {'torch', 'megatron'} & {m.split('.')[0] for m in sys.modules}, 'heavy'"
            % LLAMA)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
