"""GPU-hours a run used, every attempt and every node: from Slurm's accounting where the jobs
ran on Slurm (a requeued job counted once per incarnation), else from the ledger's attempt
times × ranks; in ``status``, ``report`` and ``runs --json``."""

from __future__ import annotations

import json

import pytest

from hpctrain.scheduler.slurm.accounting import accounted_seconds, gpus_of_tres
from hpctrain.scheduler.slurm import commands
from hpctrain.submission import submit_training
from hpctrain.view.cost import ACCOUNTING, LEDGER, GpuHours, gpu_hours_of_runs, \
    ledger_gpu_seconds
from tests.ops.helpers import (cli, crafted_run, ops_profile, ops_resolved, ops_run, record,
                               wait_stopped)
from tests.scheduler.fake_slurm import FakeSlurm


def test_without_accounting_the_ledger_times_the_ranks(tmp_path):
    root = tmp_path / "runs"
    run = crafted_run(root, ledger=[record(1, 0, 10, "preempted", True, saved=10),
                                    record(2, 10, 30, "finished", False, loaded=10)],
                      metrics=[{"step": 30, "loss": 2.25},
                               {"kind": "validation", "step": 30, "loss": 2.5}])
    ranks = run.meta()["world_size"]
    expected = 2 * 65.0 * ranks / 3600                 # two attempts of 65 s on every rank
    status = json.loads(cli(root, "status", run.id, "--json").stdout)
    assert status["gpu_hours"] == pytest.approx(expected, abs=1e-4)
    assert status["gpu_hours_source"] == "attempt times"
    assert "GPU-hours   0.0722 used, every attempt and node (from attempt times)" in \
        cli(root, "status", run.id).stdout
    (row,) = json.loads(cli(root, "runs", "--json").stdout)
    assert (row["run"], row["state"], row["step"], row["total_steps"], row["loss"],
            row["val_loss"]) == (run.id, "FINISHED", 30, 30, 2.25, 2.5)
    assert row["gpu_hours"] == status["gpu_hours"]
    import hpctrain
    (api_row,) = [r.summary() for r in hpctrain.runs(root)]
    assert api_row["gpu_hours"] == row["gpu_hours"] and api_row["val_loss"] == 2.5


def test_accounting_rows_count_gpus_per_incarnation():
    rows = [{"JobID": "41", "ElapsedRaw": "100", "AllocTRES": "billing=8,cpu=8,gres/gpu=8,node=1"},
            {"JobID": "41", "ElapsedRaw": "50",
             "AllocTRES": "billing=8,cpu=8,gres/gpu:h100=8,gres/gpu=8,node=1"},   # requeued
            {"JobID": "41", "ElapsedRaw": "0", "AllocTRES": ""},                  # pending again
            {"JobID": "99", "ElapsedRaw": "100", "AllocTRES": "gres/gpu=8"}]      # another run's
    assert accounted_seconds(rows, {"41": 4}) == {"41": 150.0 * 8}
    assert gpus_of_tres("billing=2,cpu=2,node=1", tasks=2) == 2     # no GPU resource: its ranks


def test_one_accounting_call_costs_many_runs_and_the_others_fall_back_to_their_ledgers(
        tmp_path, monkeypatch):
    """Four runs in one listing: one whose jobs Slurm accounts for (a requeued job, two
    incarnations, and its preflight job, which is not training), one on a cluster whose
    accounting tracks no GPUs (its ranks then, one per GPU), one whose job sacct no longer
    knows (its ledger's times then), one that never ran. One sacct call, for the training
    jobs."""
    slurm = FakeSlurm(tmp_path, monkeypatch)
    slurm.state["answers"] = {"sacct": {"out": "JobID|ElapsedRaw|AllocTRES\n"
                                               "41|100|cpu=2,gres/gpu=2,node=1\n"
                                               "41|50|cpu=2,gres/gpu=2,node=1\n"
                                               "42|999|cpu=2,gres/gpu=2,node=1\n"
                                               "43|10|cpu=2,node=1\n"}}
    slurm.save()
    root = tmp_path / "runs"
    accounted = crafted_run(root, ledger=[record(1, 0, 10, "preempted", True, job_id="41"),
                                          record(2, 10, 30, "finished", False, job_id="41")])
    accounted.add_job_id("41")
    accounted.add_job_id("42", kind="preflight")
    cpus_only = crafted_run(root)
    cpus_only.add_job_id("43")
    forgotten = crafted_run(root, ledger=[record(1, 0, 30, "finished", False, job_id="55")])
    forgotten.add_job_id("55")
    never = crafted_run(root)
    usage = gpu_hours_of_runs([accounted, cpus_only, forgotten, never])
    assert usage[accounted.path] == GpuHours(150 * 2 / 3600, ACCOUNTING)
    assert usage[cpus_only.path] == GpuHours(10 * cpus_only.meta()["world_size"] / 3600,
                                             ACCOUNTING)
    ranks = forgotten.meta()["world_size"]
    assert usage[forgotten.path] == GpuHours(65.0 * ranks / 3600, LEDGER)
    assert usage[never.path] == GpuHours(None, None)
    (call,) = slurm.calls("sacct")
    assert call[-2:] == ["-j", "41,43,55"]
    assert GpuHours(1 / 3, ACCOUNTING).to_json() == {"gpu_hours": 0.3333,
                                                     "gpu_hours_source": "slurm accounting"}
    assert GpuHours(None, None).to_json() == {"gpu_hours": None, "gpu_hours_source": None}
    # a run.yaml without its world size (edited by hand): the GPUs Slurm accounted still
    # count; rows without a GPU resource, and the ledger's attempts, are not guessed at
    for run in (accounted, cpus_only, forgotten):
        run.update_meta(world_size=None)
    usage = gpu_hours_of_runs([accounted, cpus_only, forgotten])
    assert usage[accounted.path] == GpuHours(150 * 2 / 3600, ACCOUNTING)
    assert usage[cpus_only.path] == usage[forgotten.path] == GpuHours(None, None)


def test_without_sacct_every_run_is_costed_from_its_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                   # no Slurm command here
    run = crafted_run(tmp_path / "runs", ledger=[record(1, 0, 30, "finished", False)])
    run.add_job_id("41")
    assert gpu_hours_of_runs([run])[run.path] == GpuHours(
        65.0 * run.meta()["world_size"] / 3600, LEDGER)


def test_the_ledger_counts_each_attempt_on_the_ranks_it_ran():
    ledger = [{"start_time": 1000.0},                        # never ended: not counted
              {"duration_s": 100.0, "world_size": 2},        # resumed on 2 ranks
              {"start_time": 1000.0, "end_time": 1030.0},    # no duration: its times
              {"duration_s": -5.0},                          # a clock stepped back: nothing
              {"duration_s": "60", "world_size": 8},         # not a number, no times: skipped
              {"duration_s": 50.0, "world_size": -2},        # ranks edited to nonsense: skipped
              {"duration_s": 7.0, "world_size": 1}]          # one rank
    assert ledger_gpu_seconds(ledger, 4) == 100.0 * 2 + 30.0 * 4 + 7.0
    assert ledger_gpu_seconds([{"duration_s": -5.0}], 4) == 0.0     # it ran, for no time
    assert ledger_gpu_seconds([{"start_time": 1000.0}], 4) is None  # nothing ended
    assert ledger_gpu_seconds([], 4) is None
    # ranks known nowhere (no world size in the record nor in run.yaml): not guessed
    assert ledger_gpu_seconds([{"duration_s": 100.0}], 0) is None
    assert ledger_gpu_seconds([{"duration_s": 100.0}, {"duration_s": 10.0, "world_size": 2}],
                              0) == 20.0


@pytest.mark.slurm
@pytest.mark.megatron
def test_a_slurm_run_is_costed_from_slurm_accounting(slurm_cluster, tmp_path):
    root = tmp_path / "runs"
    resolved = ops_resolved(ops_profile(ranks_per_node=2, step_s=0.0), steps=4)
    run = ops_run(root, resolved)
    job_id = submit_training(resolved, run).job_id
    wait_stopped(run, timeout=600)
    rows = [r for r in commands.sacct_usage([job_id]) if r["JobID"] == job_id]
    # 1 node × 2 GPUs: gres/gpu=2 where the accounting tracks GPUs; the dev cluster's tracks
    # cpu=2 (one per task), and a rank per GPU is what is counted then
    assert rows and "node=1" in rows[0]["AllocTRES"]
    assert gpus_of_tres(rows[0]["AllocTRES"], tasks=2) == 2
    accounted = sum(int(r["ElapsedRaw"]) for r in rows) * 2 / 3600
    status = json.loads(cli(root, "status", run.id, "--json").stdout)
    assert status["gpu_hours_source"] == "slurm accounting"
    assert status["gpu_hours"] == pytest.approx(accounted, abs=1e-4) and accounted > 0
    # the allocation outlives the attempt it holds (integer seconds aside)
    (attempt,) = run.ledger()
    assert accounted >= (attempt["duration_s"] - 1) * 2 / 3600
    report = json.loads(cli(root, "report", run.id, "--json").stdout)
    assert report["gpu_hours"] == status["gpu_hours"]
