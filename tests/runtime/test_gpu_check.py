"""tools/gpu_check: its CPU rehearsal runs every part for real, and its GPU configuration is a
valid ~1B-parameter job on a one-GPU profile (the GPU run itself needs a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, tool_module

TOOL = REPO / "tools" / "gpu_check"


def _tool():
    return tool_module("gpu_check")


@pytest.mark.megatron
def test_cpu_rehearsal_runs_every_part_and_writes_the_table(tmp_path):
    out = tmp_path / "report.json"
    # the budget is the GPU's 5 minutes; a loaded CPU gets what it needs (the verdict is
    # about what ran, not how fast)
    proc = subprocess.run([sys.executable, str(TOOL), "--cpu", "--out", str(out),
                           "--workdir", str(tmp_path / "work"), "--budget", "3000"],
                          capture_output=True, text=True, timeout=3600, cwd=REPO)
    report = json.loads(out.read_text())
    parts = report["parts"]
    failed = {k: v.get("error") for k, v in parts.items() if not v.get("ok")}
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:], proc.stderr[-3000:])
    assert parts["versions"]["megatron_core"] == "0.16.1"
    train, bare, resume = parts["train"], parts["bare"], parts["resume"]
    local, memory, speedups = parts["local"], parts["memory"], parts["speedups"]
    assert train["transformer_impl"] == "local"
    # the train column runs torch's fused attention, the local and bare columns megatron's own
    assert train["attention"] == "torch sdpa flash (tried flash,math)"
    assert local["attention"] == "local (megatron-core unfused)"
    assert train["optimizer"] == "DistributedOptimizer(torch.optim.AdamW fused)"
    assert local["optimizer"] == "DistributedOptimizer(torch.optim.AdamW)"
    assert train["step_time_s"] > 0 and bare["step_time_s"] > 0 and local["step_time_s"] > 0
    assert train["end_step"] == 44
    assert [s["reason"] for s in train["saves"]] == ["periodic", "periodic", "final"]
    assert len(train["save_stalls_s"]) == 2 and all(x >= 0 for x in train["save_stalls_s"])
    # memory of the staged sizes taken while the first save's writer ran: the staging memory
    # refused it, and the resume found the weights of the save's digest
    assert train["staging_refused_the_fill"]
    # the staging memory was page-locked (the CPU's stand-in) after the first step, within the
    # logged steps
    assert train["host_staging_locked_through_step"] >= 2
    assert "page-locked" in train["host_staging"] and "after step 1" in train["host_staging"]
    assert resume["start_step"] == 44 and resume["end_step"] == 48
    assert resume["loaded"].endswith("step-00000044") and resume["digest_checked"]
    assert resume["read"]["verified"] == resume["read"]["items"] > 0
    # the model's weights load whole: streamed, on the CPU straight into them (no ring)
    assert 0 < resume["streamed"] <= resume["read"]["items"] and resume["ring_bytes"] == 0
    assert any(r[1] == "resume: load | read" and "streamed straight into their tensors" in r[2]
               for r in report["table"])
    assert resume["read_gb_per_s"] > 0
    assert parts["plan"]["predicted_peak_bytes"] > 0
    # what the reference loop's first microbatch kept for backward on the train column's job
    # (fused attention), measured through autograd's saved-tensor hooks, is the planner's
    # activation count to the byte
    act = parts["plan"]["activation_bytes"]
    saved = memory["memory"]["saved_first_microbatch"]
    assert saved["bytes"] == act["chunk_microbatch"] + act["output_layer"] + act["embedding"]
    assert "decoder.layers.*.mlp" in saved["by_module"]
    # one step of it profiled: the host's time to issue it, and the operators it went to
    host = memory["host_profile"]
    assert 0 < host["issued_s"] <= host["step_s"] and host["host_ops_s"] > 0
    assert len(host["top_host_ops"]) == 25 and host["top_host_ops"][0]["self_ms"] > 0
    assert any(r[:2] == ["host", "reference loop: most host time of their own"]
               for r in report["table"])
    # and hpctrain's own run profiled a step of its own (train.profile_step)
    ours = train["host_profile"]
    assert 0 < ours["issued_s"] <= ours["step_s"] and len(ours["top_host_ops"]) == 25
    assert train["peak_memory_bytes"] is None     # no GPU: nothing to measure
    assert set(speedups["attention_fwd_bwd_ms"]) == {"megatron unfused", "flash", "math"}
    assert speedups["adamw"]["fused_ms"] > 0 and speedups["adamw"]["foreach_ms"] > 0
    assert "part        resume" in proc.stdout and "FAILED" not in proc.stdout
    assert [r[1] for r in report["table"] if r[0] == "part"] == \
        ["versions", "plan", "train", "local", "bare", "memory", "resume", "speedups",
         "kernels", "variants", "preflight", "preemption"]
    # each part's progress was printed, and the report written, as it finished
    assert proc.stdout.index("part versions: ok") < proc.stdout.index("part preemption: ok")
    # the kernel table, in the package's format, and the plan's step time from it beside the
    # measured one
    from hpctrain.config.kernel_table import load_table
    kernels = parts["kernels"]
    table = load_table(kernels["table_file"])
    assert table.device == "cpu" and kernels["attention_backends"] == ["local", "torch-flash"]
    assert len(table.gemm) == 3 * len(tool_grid()) ** 3 and table.bandwidth_gbs > 0
    assert kernels["predicted_step_time_s"] > 0
    # this machine's host, both kinds of layer, in the table and in the report
    assert set(table.host.per_layer_s) == {"local", "torch"}
    assert kernels["host"]["per_layer_s"] == table.host.per_layer_s
    assert any(r[:2] == ["kernels", "host issue per layer | per microbatch"]
               for r in report["table"])
    assert any(r[:2] == ["step", "plan from the table | measured"] for r in report["table"])
    # the planner's variants, all trained in one process: each model freed before the next,
    # each measured beside the plan (on the CPU the kept-for-backward count is exact)
    variants = parts["variants"]["variants"]
    assert set(variants) == {f"{name} {a}" for name, _, _ in _tool().CPU_VARIANTS
                             for a in ("local", "fused")}
    for name, v in variants.items():
        assert v["released"] is True, name
        assert 0 < v["host_issue_s"] <= v["step_time_s"] + 1e-3, name   # within the step
        assert v["step_time_s"] > 0 and v["predicted_step_time_s"] > 0, name
        assert v["predicted_host_issue_s"] > 0, name   # the plan's host, from the table
        assert v["saved_first_microbatch_bytes"] == v["predicted_saved_bytes"], name
        assert v["attention"].startswith("torch sdpa" if name.endswith("fused") else "local")
    assert parts["variants"]["planned_with"] == "kernel table"
    # where the resume's time went
    assert set(resume["read"]["phases_s"]) == {"checks_s", "template_s", "read_s", "apply_s",
                                               "digest_s"}
    # preflight through the local executor: the process group formed and the all-reduce ran
    assert parts["preflight"]["backend"] == "gloo"
    assert parts["preflight"]["allreduce"].startswith("1 rank: the process group formed")
    # the signalled run saved, was requeued and resumed where it saved, and on the CPU ends with
    # the uninterrupted run's weights bit for bit
    drill = parts["preemption"]
    assert drill["attempts"] == ["preempted", "finished"] and drill["signalled_ranks"] == 1
    assert drill["resumed_from"] == drill["saved_at"] == 21 and drill["end_step"] == 30
    assert drill["same_weights"] and drill["loss"] == drill["straight_loss"]


def tool_grid():
    return _tool().CPU_KERNEL_GRID


def test_a_failed_part_is_a_row_and_the_others_still_run():
    tool = _tool()
    parts = tool.Parts(budget_s=60)

    def broken(timeout):
        raise tool.PartFailed("exit code 1; see log", log_tail="boom")

    parts.run("train", broken)
    parts.run("plan", lambda timeout: {"predicted_peak_bytes": 1 << 30})
    assert parts.results["train"]["ok"] is False and parts.results["train"]["log_tail"] == "boom"
    assert parts.results["plan"]["ok"] is True
    rows = tool.table_rows(parts.results, "cuda")
    assert ("part", "train", "FAILED: exit code 1; see log (0.0 s)") in rows
    assert parts.timeout("train") <= 60


def test_the_gpu_configuration_is_a_valid_one_billion_parameter_job_on_one_gpu():
    from hpctrain.config import job_from_mapping, profile_from_mapping, resolve
    from hpctrain.model_shape import ModelShape, total_parameters
    tool = _tool()
    job = job_from_mapping(tool.job_mapping("/data/kjv", cpu=False,
                                            transformer_impl="local"), "job")
    stock = job_from_mapping(tool.job_mapping("/data/kjv", cpu=False, transformer_impl="local",
                                              stock_local=True), "job")
    assert stock.model.attention_backend == "local" and not stock.train.fused_adam
    assert not (stock.model.apply_rope_fusion or stock.model.cross_entropy_loss_fusion)
    drill = job_from_mapping(tool.drill_job("/data/kjv", cpu=False, transformer_impl="local"),
                             "job")
    assert drill.train.deterministic_mode
    profile = profile_from_mapping(tool.profile_mapping(False, 989.0, 79.1), "p.yaml", "p")
    resolved = resolve(job, profile)
    assert resolved.layout.world_size == 1 and profile.node.device == "cuda"
    assert job.train.precision == "bf16" and job.parallel.use_distributed_optimizer
    total = total_parameters(ModelShape.from_model(job.model), 1)
    assert 0.9e9 < total < 1.1e9, total
    assert tool.peak_for("NVIDIA H100 80GB HBM3") == 989.0
    assert tool.peak_for("NVIDIA H100 PCIe") == 756.0
    assert tool.peak_for("NVIDIA H200") == 989.0
    assert tool.peak_for("Some Other GPU") is None


def test_the_check_models_micro_batch_can_be_chosen_with_the_same_global_batch():
    """--micro-batch-size (at 2 an H100 runs the fused attention's step bound by the host, at 4
    by the GPU) changes the micro-batch of every column and nothing else."""
    from hpctrain.config import job_from_mapping
    tool = _tool()
    for stock in (False, True):
        base = tool.job_mapping("/data/kjv", cpu=False, transformer_impl="local",
                                stock_local=stock)
        four = tool.job_mapping("/data/kjv", cpu=False, transformer_impl="local",
                                stock_local=stock, micro_batch_size=4)
        assert base["batch"]["micro_batch_size"] == 2 and four["batch"]["micro_batch_size"] == 4
        assert four["batch"]["global_batch_size"] == base["batch"]["global_batch_size"]
        assert {k: v for k, v in four.items() if k != "batch"} == \
            {k: v for k, v in base.items() if k != "batch"}
        assert job_from_mapping(four, "job").batch.micro_batch_size == 4


def test_the_step_in_which_page_locking_ended_is_found_from_the_logged_step_times():
    through = _tool().locked_through_step
    times = {1: 5.0, 2: 0.8, 3: 0.8, 4: 0.8, 5: 0.8}
    assert through({"after_step": 1, "seconds": 2.0}, times) == 4     # 0.8 + 0.8 + 0.8 >= 2
    assert through({"after_step": 1, "seconds": 1.6}, times) == 3
    assert through({"after_step": 2, "seconds": 0.1}, times) == 3
    assert through({"after_step": 1, "seconds": 9.0}, times) is None  # still locking at the end
    assert through(None, times) is None and through({"after_step": None, "seconds": 1}, times) \
        is None
