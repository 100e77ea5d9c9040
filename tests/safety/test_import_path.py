"""The batch script runs in its run folder, and Python there does not import from the folder
the job was submitted from, nor from the run folder: a planted ``shlex.py`` (a module the
batch steps import) is never loaded.

The first test runs the real rendered script under bash with the real interpreter and the
real batch steps on a real run folder; only srun, scontrol and squeue are stand-ins (no Slurm
needed). The second submits a real job to the dev Slurm cluster from such a folder.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpctrain.config import load_job, load_profile, resolve
from hpctrain.scheduler.slurm.render import render_sbatch
from hpctrain.submission import prepare_run, script_inputs, submit_function
from tests.conftest import REPO, job_gone, wait_until
from tests.safety import stubs
from tests.scheduler import tasks


def plant(folder, canary) -> None:
    """A shlex.py that leaves a mark when imported (and breaks whoever imports it)."""
    (folder / "shlex.py").write_text(
        f"import pathlib\npathlib.Path({str(canary)!r}).write_text(__file__)\n")


def test_planted_modules_in_the_submit_folder_and_run_folder_are_not_imported(tmp_path):
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    run = prepare_run(r, tmp_path / "runs")
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(r, script_inputs(run, r.profile)))
    submitted_from = tmp_path / "submitted-from"
    submitted_from.mkdir()
    canary = tmp_path / "imported"
    plant(submitted_from, canary)
    plant(run.path, canary)
    bin_dir, _ = stubs.install(tmp_path / "stubs")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "localhost", "STUB_LOG": str(tmp_path / "stub"), "STUB_ATTEMPT_DIR": str(tmp_path / "unused")}
    env.pop("PYTHONSAFEPATH", None)
    proc = subprocess.run(["bash", str(script)], cwd=submitted_from, env=env, capture_output=True,
                          text=True, timeout=300)
    assert not canary.exists(), f"a planted module was imported: {canary.read_text()}"
    # the real batch steps ran (begin numbered the attempt, end wrote the ledger) and srun was called
    # from the run folder with the run's own submitit folder
    assert (run.attempt_dir(1) / "batch.log").exists(), proc.stderr
    assert len(run.ledger()) == 1, (proc.stdout, proc.stderr)
    args = stubs.srun_args(tmp_path)
    assert args[-5:] == [sys.executable, "-u", "-m", "submitit.core._submit", str(run.submitit_dir)]
    srun_env = stubs.srun_env(tmp_path)
    assert srun_env["PWD"] == str(run.path) and srun_env["PYTHONSAFEPATH"] == "1"


@pytest.mark.slurm
def test_a_real_job_submitted_beside_a_planted_module_does_not_import_it(slurm_cluster, tmp_path,
                                                                          monkeypatch):
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), load_profile("dev-slurm"))
    submitted_from = tmp_path / "submitted-from"
    submitted_from.mkdir()
    canary = tmp_path / "imported"
    plant(submitted_from, canary)
    monkeypatch.chdir(submitted_from)
    run = prepare_run(r, tmp_path / "runs")
    plant(run.path, canary)
    sub = submit_function(run, r.profile, tasks.fail_on_rank, (99,), resolved=r)
    assert sub.job.results() == ["ok"] * r.profile.world_size
    wait_until(lambda: job_gone(sub.job_id), what="the batch shell to finish")
    assert not canary.exists(), f"a planted module was imported: {canary.read_text()}"
    (rec,) = run.ledger()
    assert rec["exit_reason"] == "finished"
