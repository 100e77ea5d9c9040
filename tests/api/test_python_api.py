"""The Python API as a notebook or a script uses it: ``hpctrain.submit`` returns a ``Run`` that
waits, says its status and hands over its metrics; ``hpctrain.Run(path)`` opens a run folder,
``hpctrain.runs()`` lists them, ``hpctrain.plan()`` plans a job; ``dry_run``, ``nodes``,
``chain`` and ``sweep`` mirror the command line. Only the API is called (the CLI only to check
that both give the same data), with the operations tests' tiny job on the real dev Slurm cluster
and on this machine."""

from __future__ import annotations

import json

import pytest

import hpctrain
from hpctrain.errors import RunNotFoundError, UsageError
from tests.conftest import REPO
from tests.conftest import hpctrain as hpctrain_cli

JOB = REPO / "tests" / "ops" / "tiny-ops.yaml"    # 30 steps, logs every 2, checkpoints every 10


def _as_json(data):
    return json.loads(json.dumps(data, default=str))


@pytest.fixture
def one_rank(tmp_path):
    """The local profile with one rank (tiny-ops' batch splits over one or two ranks)."""
    path = tmp_path / "one-rank.yaml"
    text = (REPO / "cluster_profiles" / "local.yaml").read_text()
    path.write_text(text.replace("gpus_per_node: 4", "gpus_per_node: 1")
                    .replace("name: local", "name: one-rank"))
    return path


@pytest.mark.slurm
@pytest.mark.megatron
def test_a_chain_submitted_to_slurm_is_waited_for_and_reports_its_status_and_metrics(
        slurm_cluster, tmp_path):
    root = tmp_path / "runs"
    run = hpctrain.submit(JOB, profile="dev-slurm", nodes=1, chain=2, runs_dir=root)
    assert isinstance(run, hpctrain.Run) and run.path.parent == root.resolve()
    first, second = run.job_ids()
    assert run.wait(timeout_s=900) == "FINISHED"      # through both jobs of the chain
    status = run.status()
    assert (status["state"], status["run"], status["world_size"]) == ("FINISHED", run.id, 2)
    assert [j["job_id"] for j in status["jobs"]] == [first, second]
    # the first job trained the run to its end; the second found it finished and exited at once
    assert [(a["attempt"], a["job_id"], a["exit_reason"], a["end_step"])
            for a in status["attempts"]] == [(1, first, "finished", 30)]
    assert status["checkpoint"]["step"] == 30
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == list(range(2, 31, 2))
    assert all(isinstance(m["loss"], float) for m in metrics)
    assert metrics[-1]["loss"] == status["loss"]
    # the same data as `hpctrain status RUN --json`, from a Run opened by its folder
    opened = hpctrain.Run(str(run.path))
    assert opened == run and opened.metrics() == metrics
    cli = hpctrain_cli("status", run.id, "--json", env={"HPCTRAIN_RUNS_DIR": str(root)},
                       check=True)
    assert json.loads(cli.stdout) == _as_json(opened.status())
    assert [r.id for r in hpctrain.runs(root)] == [run.id]
    assert [r["run"] for r in json.loads(hpctrain_cli(
        "runs", "--json", env={"HPCTRAIN_RUNS_DIR": str(root)}, check=True).stdout)] == \
        [r.summary()["run"] for r in hpctrain.runs(root)]


@pytest.mark.megatron
def test_a_run_on_this_machine_is_waited_for_and_gives_its_metrics(tmp_path, one_rank):
    run = hpctrain.submit(str(JOB), profile=one_rank, runs_dir=tmp_path / "runs")
    assert run.meta()["scheduler"] == "local" and run.meta()["world_size"] == 1
    assert run.wait(timeout_s=600) == "FINISHED"
    status = run.status()
    assert [(a["exit_reason"], a["end_step"]) for a in status["attempts"]] == [("finished", 30)]
    records = run.metrics(as_frame=False)
    assert [m["step"] for m in records] == list(range(2, 31, 2))
    try:
        import pandas  # noqa: F401  (not a dependency: the frame is there only with it)
    except ImportError:
        with pytest.raises(UsageError, match=r"needs pandas: pip install pandas"):
            run.metrics(as_frame=True)
    else:
        frame = run.metrics(as_frame=True)
        assert list(frame["step"]) == [m["step"] for m in records]
        assert list(frame["loss"]) == [m["loss"] for m in records]


def test_a_dry_run_prepares_the_run_and_the_script_a_submission_would_send(tmp_path):
    root = tmp_path / "runs"
    run = hpctrain.submit(JOB, profile="dev-slurm", nodes=1, dry_run=True, runs_dir=root)
    assert run.meta()["dry_run"] is True and run.meta()["world_size"] == 2   # nodes=1 × 2
    assert run.job_ids() == []
    assert run.state() == "NOT SUBMITTED" and run.wait() == "NOT SUBMITTED"
    assert run.status()["state"] == "NOT SUBMITTED" and run.metrics() == []
    rendered = hpctrain_cli("render", str(JOB), "-p", "dev-slurm", "-N", "1", "--run-dir",
                            str(run.path), check=True).stdout
    assert run.script_file.read_text() == rendered
    later = hpctrain.submit(JOB, profile="dev-slurm", nodes=1, dry_run=True, runs_dir=root)
    assert [r.id for r in hpctrain.runs(root)] == [later.id, run.id]        # newest first
    assert [r.id for r in hpctrain.runs(root, limit=1)] == [later.id]


def test_a_sweep_gives_one_run_per_combination_from_a_mapping_or_cli_specs(tmp_path):
    values = [{"train.lr": 0.001, "train.steps": 10}, {"train.lr": 0.003, "train.steps": 10}]
    for i, sweep in enumerate([{"train.lr": [1e-3, 3e-3], "train.steps": [10]},
                               ["train.lr=1e-3,3e-3", "train.steps=10"]]):
        runs = hpctrain.submit(JOB, profile="dev-slurm", nodes=1, sweep=sweep, dry_run=True,
                               runs_dir=tmp_path / f"runs{i}")
        assert [r.meta()["sweep"]["values"] for r in runs] == values
        assert [r.resolved_job().train.lr for r in runs] == [0.001, 0.003]
        sweep_dir = runs[0].path.parent / "sweeps" / runs[0].meta()["sweep"]["id"]
        assert "#SBATCH --array=0-1" in (sweep_dir / "sbatch.sh").read_text()


def test_bad_requests_are_usage_errors_and_create_nothing(tmp_path, one_rank):
    root = tmp_path / "runs"
    with pytest.raises(UsageError, match=r"--chain needs a Slurm profile; 'one-rank' runs"):
        hpctrain.submit(JOB, one_rank, chain=2, runs_dir=root)
    with pytest.raises(UsageError, match=r"--chain with --sweep"):
        hpctrain.submit(JOB, profile="dev-slurm", nodes=1, chain=2, sweep={"train.lr": [1e-3]},
                        runs_dir=root)
    with pytest.raises(UsageError, match=r"sweep train.data: 'a,\"b' cannot be a sweep value"):
        hpctrain.submit(JOB, one_rank, sweep={"train.data": ['a,"b']}, runs_dir=root)
    with pytest.raises(UsageError, match=r"--nodes: a local profile runs on this machine only"):
        hpctrain.submit(JOB, one_rank, nodes=2, runs_dir=root)
    with pytest.raises(UsageError, match=r"chain \(--chain\): expected an integer from 1 to 1,000, got 0"):
        hpctrain.submit(JOB, one_rank, chain=0, runs_dir=root)
    assert not root.exists() and hpctrain.runs(root) == []
    with pytest.raises(RunNotFoundError, match=r"is not a run folder"):
        hpctrain.Run(tmp_path).status()


def test_plan_gives_the_data_plan_json_prints():
    job = REPO / "examples" / "llama2-7b.yaml"
    data = hpctrain.plan(job, profile="h100-ib-pyxis", nodes=2)
    cli = hpctrain_cli("plan", str(job), "-p", "h100-ib-pyxis", "-N", "2", "--json", check=True)
    assert data == json.loads(cli.stdout)
    assert data["world_size"] == 16 and data["layouts"]
    pinned = hpctrain.plan(job, profile="h100-ib-pyxis", nodes=2, tp=4, pp=2)
    assert [(p["tensor_model_parallel_size"], p["pipeline_model_parallel_size"])
            for p in pinned["layouts"]] == [(4, 2)]
    invalid = hpctrain.plan(job, profile="h100-ib-pyxis", nodes=2, tp=3)
    assert invalid["layouts"] == [] and invalid["rejected"][0]["layout"].startswith("TP3")


def test_a_profile_file_may_be_given_as_a_path(one_rank):
    assert hpctrain.plan(JOB, one_rank) == hpctrain.plan(JOB, str(one_rank))
    run = hpctrain.submit(JOB, one_rank, dry_run=True, runs_dir=one_rank.parent / "runs")
    assert run.resolved_profile().name == "one-rank"
