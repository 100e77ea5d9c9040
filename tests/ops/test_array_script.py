"""The sweep's job-array script: each task picks its own run folder by SLURM_ARRAY_TASK_ID, run
folder names with hostile characters stay inert, and non-array scripts are unchanged."""

from __future__ import annotations

import subprocess

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.scheduler.slurm.render import ScriptInputs, render_sbatch
from tests.conftest import REPO


def array_script(run_dirs: list[str], parallelism=None) -> str:
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    return render_sbatch(r, ScriptInputs(run_dir="/runs/sweeps/s", python="/usr/bin/python3",
                                         step_python="/usr/bin/python3",
                                         submitit_dir="/runs/sweeps/s/submitit",
                                         array_run_dirs=run_dirs, array_parallelism=parallelism))


def test_each_task_selects_its_run_folder_and_hostile_names_stay_inert(tmp_path):
    marker = tmp_path / "pwned"
    dirs = ["/runs/a", f"/runs/b $(touch {marker}) c", "/runs/it's `touch x`"]
    text = array_script(dirs, parallelism=2)
    assert "#SBATCH --array=0-2%2" in text
    assert "#SBATCH --output=/runs/sweeps/s/logs/slurm-%A_%a.log" in text
    assert '-u -m submitit.core._submit "$RUN_DIR/submitit"' in text
    head = text.split('cd "$RUN_DIR"', 1)[0]  # directives and the run-folder table
    for i, expected in enumerate(dirs):
        probe = head + 'printf "%s" "$RUN_DIR"'
        got = subprocess.run(["bash", "-c", probe], env={"SLURM_ARRAY_TASK_ID": str(i)},
                             capture_output=True, text=True, timeout=30)
        assert got.stdout == expected
    assert not marker.exists()
    assert subprocess.run(["bash", "-n", "-c", text]).returncode == 0


def test_no_limit_without_max_parallel_and_plain_scripts_have_no_array():
    assert "#SBATCH --array=0-1\n" in array_script(["/runs/a", "/runs/b"])
    plain = array_script([])
    assert "--array" not in plain and "RUN_DIRS" not in plain
    assert "RUN_DIR=/runs/sweeps/s\n" in plain
