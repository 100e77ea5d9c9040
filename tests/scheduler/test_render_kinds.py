"""The two scripts a profile renders: the training job (spare nodes, the preflight gate,
requeue) and the preflight-only job of ``hpctrain preflight`` (its nodes only, no gate, no
requeue); a sweep's job array, a chain's dependency, and run folders pyxis cannot mount
(pure: rendering only, no Slurm)."""

from __future__ import annotations

import pytest
from test_render import profile_with

from hpctrain.config import load_job, resolve
from hpctrain.errors import UsageError
from hpctrain.scheduler.slurm.render import ScriptInputs, render_sbatch
from tests.conftest import REPO


def _render(profile, kind: str = "train", run_dir: str = "/runs/case", **inputs) -> str:
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), profile)
    return render_sbatch(r, ScriptInputs(run_dir=run_dir, python="/usr/bin/python3",
                                         step_python="/usr/bin/python3",
                                         submitit_dir=f"{run_dir}/submitit", kind=kind, **inputs))


def test_a_profile_with_a_spare_node_and_the_gate_trains_with_both_and_preflights_without():
    profile = profile_with("dev-slurm", {"slurm": {"nodes": 2},
                                         "resilience": {"spare_nodes": 1},
                                         "preflight": {"gate": True}})
    train = _render(profile)
    assert "#SBATCH --nodes=3\n" in train and "#SBATCH --no-kill\n" in train
    assert "#SBATCH --requeue\n" in train and "-m hpctrain.preflight.gate" in train
    check = _render(profile, kind="preflight")
    assert "#SBATCH --nodes=2\n" in check
    assert "--no-kill" not in check and "#SBATCH --no-requeue\n" in check
    assert "-m hpctrain.preflight.gate" not in check
    assert "--signal" not in check
    assert train.splitlines()[0] == check.splitlines()[0] == "#!/bin/bash"


@pytest.mark.parametrize("folder", ["/runs/a,b", "/runs/a:b"])
def test_a_run_folder_pyxis_cannot_mount_is_refused_before_anything_is_written(folder):
    profile = profile_with("dev-slurm", {"container": {"image": "/images/hpctrain.sqsh"}})
    with pytest.raises(UsageError, match="holds ',' or ':', which pyxis's --container-mounts "
                                         "cannot express"):
        _render(profile, run_dir=folder)
    # without a container the folder is mounted by nobody: it renders
    assert "/runs/a" in _render(profile_with("dev-slurm", {}), run_dir=folder)


def test_a_sweep_of_three_runs_is_one_array_of_three_tasks_two_at_a_time():
    profile = profile_with("dev-slurm", {})
    runs = [f"/runs/sweep/lr-{i}" for i in range(3)]
    text = _render(profile, run_dir="/runs/sweep", array_run_dirs=runs, array_parallelism=2)
    assert "#SBATCH --array=0-2%2\n" in text
    assert "#SBATCH --output=/runs/sweep/logs/slurm-%A_%a.log\n" in text
    assert "#SBATCH --array=0-2\n" in _render(profile, run_dir="/runs/sweep", array_run_dirs=runs)
    assert "#SBATCH --array=0-0\n" in _render(profile, run_dir="/runs/sweep",
                                                array_run_dirs=runs[:1])


def test_a_chained_job_waits_for_its_predecessor_and_a_bad_dependency_is_refused():
    profile = profile_with("dev-slurm", {})
    text = _render(profile, dependency="afterany:4242")
    assert "#SBATCH --dependency=afterany:4242\n" in text
    with pytest.raises(UsageError, match="is not a Slurm dependency"):
        _render(profile, dependency="afterany:4242;id")
