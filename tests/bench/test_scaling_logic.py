"""bench scaling's arithmetic without a cluster: sizes, batches, throughput, efficiency, plot;
and a size whose checkpoint folder is refused leaves no run folder."""

from __future__ import annotations

import pytest

from hpctrain.bench import scaling as sc
from hpctrain.bench.scaling_report import build_figure, table
from hpctrain.config import load_job, load_profile
from hpctrain.errors import UsageError
from tests.conftest import REPO

LLAMA = REPO / "examples" / "llama2-7b.yaml"


def test_node_counts_are_parsed_or_refused_by_name():
    assert sc.parse_sizes("4,1,2,2") == [1, 2, 4]
    for bad in ("", "1,,2", "0,1", "a", "1.5", "99999999"):
        with pytest.raises(UsageError, match="--nodes: expected node counts like 1,2,4"):
            sc.parse_sizes(bad)


def test_weak_scaling_keeps_the_work_per_rank_and_strong_the_global_batch():
    job, profile = load_job(LLAMA), load_profile("h100-ib-pyxis")   # 16 nodes: 16 per rank
    weak = sc.plan_sizes(job, profile, [1, 2, 4], steps=30, strong=False)
    assert [s.world_size for s in weak] == [8, 16, 32]
    assert [s.resolved.layout.num_microbatches for s in weak] == [16, 16, 16]
    assert [s.global_batch_size for s in weak] == [64, 128, 256]
    strong = sc.plan_sizes(job, profile, [1, 2, 4], steps=30, strong=True)
    assert [s.global_batch_size for s in strong] == [1024] * 3
    assert [s.resolved.layout.num_microbatches for s in strong] == [256, 128, 64]
    sized = weak[0].resolved.job
    assert (sized.train.steps, sized.train.log_interval) == (30, 1)
    assert sized.checkpoint.interval_steps == 0 and sized.checkpoint.interval_minutes == 0
    assert not sized.checkpoint.save_at_end and sized.checkpoint.dir is None
    assert sized.train.warmup_steps == 30            # the job's 2000, cut to the run


def test_sizes_that_cannot_run_the_job_are_all_named_before_anything_is_submitted():
    import dataclasses
    job, profile = load_job(LLAMA), load_profile("h100-ib-pyxis")
    # nodes of 2 GPUs, TP2: 3 nodes make DP3, over which a global batch of 1024 does not divide
    small = dataclasses.replace(profile, slurm=dataclasses.replace(profile.slurm,
                                                                   gpus_per_node=2))
    with pytest.raises(UsageError) as err:
        sc.plan_sizes(job, small, [1, 3], steps=30, strong=True)
    assert "1 of 2 sizes cannot run this job; nothing was submitted" in str(err.value)
    assert "3 node(s)" in str(err.value)
    with pytest.raises(UsageError, match="runs on this machine only"):
        sc.plan_sizes(job, load_profile("local"), [1, 2], steps=30, strong=False)


def record(step, tps, t, skipped=False):
    return {"step": step, "tokens_per_s": tps, "step_time_s": t, "skipped": skipped}


def test_throughput_after_the_warmup_weighs_each_step_by_its_time():
    metrics = [record(1, 10.0, 9.0), record(2, 50.0, 2.0), record(3, 100.0, 1.0),
               record(4, 50.0, 2.0), record(5, 1.0, 1.0, skipped=True),
               record(3, 200.0, 0.5)]            # step 3 redone by a resumed attempt: it counts
    tps, step_s, n = sc.measured_throughput(metrics, warmup=1)
    # steps 2, 3 (redone) and 4: (100 + 100 + 100) tokens in 4.5 s
    assert n == 3 and tps == pytest.approx(300 / 4.5) and step_s == pytest.approx(1.5)
    assert sc.measured_throughput(metrics, warmup=10) == (None, None, 0)


def sizes_with(tokens_per_s, plan_compute, plan_comm=0.0):
    job, profile = load_job(LLAMA), load_profile("h100-ib-pyxis")
    sizes = sc.plan_sizes(job, profile, [1, 2, 4], steps=30, strong=False)
    for s, tps, c in zip(sizes, tokens_per_s, plan_compute):
        s.tokens_per_s = tps
        s.step_time_s = s.tokens_per_step / tps if tps else None
        s.plan_compute_s, s.plan_comm_s = c, plan_comm
    return sizes


def test_efficiency_is_tokens_per_rank_against_the_smallest_size():
    sizes = sizes_with([1000.0, 1800.0, None], [1.0, 1.0, 1.0])
    sc.efficiencies(sizes)
    assert sizes[0].efficiency == 1.0
    assert sizes[1].efficiency == pytest.approx((1800 / 16) / (1000 / 8))   # 90%
    assert sizes[2].efficiency is None                                       # not measured


def test_calibration_sets_the_smallest_size_and_keeps_the_planners_shape():
    # the planner's compute per step is the same at every size (weak scaling), communication
    # 0.1 s; the 1-node run took 2.0 s per step
    sizes = sizes_with([None, None, None], [4.0, 4.0, 4.0], plan_comm=0.1)
    sizes[0].step_time_s = 2.0
    sc.calibrate(sizes)
    assert sizes[0].predicted_step_s == pytest.approx(2.0)
    assert sizes[1].predicted_step_s == pytest.approx((2.0 - 0.1) / 4.0 * 4.0 + 0.1)
    sc.efficiencies(sizes)
    assert sizes[2].predicted_efficiency == pytest.approx(1.0)


def test_the_planner_predicts_from_the_profiles_peak():
    job, profile = load_job(LLAMA), load_profile("h100-ib-pyxis")
    sizes = sc.plan_sizes(job, profile, [1, 16], steps=30, strong=False)
    basis = sc.predict(sizes)
    assert "989 TFLOP/s" in basis
    assert all(s.predicted_step_s and s.predicted_tokens_per_s for s in sizes)
    sc.efficiencies(sizes)
    # more DP across nodes: the planner expects the gradient traffic to cost something
    assert 0.5 < sizes[1].predicted_efficiency < 1.0


def test_table_and_plot_show_both_curves_and_the_target():
    sizes = sizes_with([1000.0, 1800.0, 3000.0], [1.0, 1.0, 1.0])
    for s, t in zip(sizes, (1.0, 1.05, 1.2)):
        s.predicted_step_s = t
        s.outcome = "finished"
    sc.efficiencies(sizes)
    result = sc.ScalingResult("llama2-7b", "h100-ib-pyxis", False, 30, 10, sizes, "test")
    lines = table(result)
    assert lines[0].startswith("Weak scaling of llama2-7b on h100-ib-pyxis")
    assert lines[2].split()[:3] == ["1", "8", "TP2×PP1×DP4"]
    assert "90.0%" in lines[3] and "below it at 4 node(s)" in lines[-2]
    fig = build_figure(result)
    lines_by_gid = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines()}
    assert list(lines_by_gid["measured-efficiency"].get_xdata()) == [8, 16, 32]
    assert list(lines_by_gid["measured-efficiency"].get_ydata()) == pytest.approx(
        [1.0, 0.9, 0.75])
    assert list(lines_by_gid["target"].get_ydata()) == [0.85, 0.85]
    assert len(lines_by_gid["planned-efficiency"].get_xdata()) == 3


def test_a_refused_size_leaves_no_run_folder(tmp_path, monkeypatch):
    """Another run claims a size's checkpoint folder (``<storage.checkpoint_root>/<run id>``,
    which every runs folder shares) after the size's run folder was made and before its own
    claim: the bench stops with the refusal, and the run folder it made is gone."""
    import dataclasses

    import hpctrain.submission as submission
    from hpctrain.record import checkpoint_store as store
    profile = load_profile("dev-slurm")
    profile = dataclasses.replace(profile, storage=dataclasses.replace(
        profile.storage, checkpoint_root=str(tmp_path / "ckpt")))
    root = tmp_path / "runs"
    (root / "earlier-run").mkdir(parents=True)            # not the bench's: must stay
    created = []

    def prepare_then_lose_the_folder(*args, **kwargs):
        run = real_prepare_run(*args, **kwargs)
        created.append((run.path, run.checkpoint_dir()))
        store.claim(run.checkpoint_dir(), "rival-run")     # the other run wins
        return run

    real_prepare_run = submission.prepare_run
    monkeypatch.setattr(submission, "prepare_run", prepare_then_lose_the_folder)
    with pytest.raises(store.ForeignCheckpointsError, match="owner.json names run rival-run"):
        sc.run_scaling(load_job(REPO / "examples" / "tiny.yaml"), profile, [2], runs_root=root,
                       steps=8, warmup=3)
    ((run_dir, ckpt),) = created
    assert not run_dir.exists()                            # the size's run folder is gone
    assert sorted(p.name for p in root.iterdir()) == ["earlier-run"]
    assert store.read_owner(ckpt)["run"] == "rival-run"    # the winner's claim is untouched
