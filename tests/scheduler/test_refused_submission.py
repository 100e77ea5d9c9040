"""A submission sbatch refuses reaches no scheduler: the user gets sbatch's words and a line
saying nothing was queued, and the run folder (or the sweep's folders) this submission prepared
is removed, so ``hpctrain runs`` is not cluttered with a run that never was. Never another
run's files, nor a folder holding more than the submission wrote.

sbatch here is a stand-in on ``PATH`` that refuses as Slurm's does (its words, exit 1); the
rest is the real CLI in a subprocess. The dev cluster's own refusal (an unknown partition) is
tested in ``test_submit_slurm.py``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpctrain.record.folder import RunFolder
from hpctrain.submission.folders import PREPARED_RUN, holds_only, remove_refused_run
from tests.conftest import REPO, hpctrain, one_error_line

REFUSAL = ("sbatch: error: invalid partition specified: nosuchpart\n"
           "sbatch: error: Batch job submission failed: Invalid partition name specified\n")


@pytest.fixture
def refusing_sbatch(tmp_path) -> dict:
    """The environment of a submission whose sbatch refuses every job, and counts its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"#!/bin/bash\necho called >> {tmp_path / 'sbatch-calls'}\n"
                      f"printf '%s' '{REFUSAL}' >&2\nexit 1\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")}


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def test_a_refused_job_leaves_no_run_folder_and_says_what_sbatch_said(refusing_sbatch, tmp_path):
    root = Path(refusing_sbatch["HPCTRAIN_RUNS_DIR"])
    hpctrain("submit", "examples/tiny.yaml", "--dry-run", env=refusing_sbatch, check=True)
    before = _tree(root)                     # another run, prepared earlier: never touched
    proc = hpctrain("submit", "examples/tiny.yaml", "-p", "dev-slurm", "--force",
                    env=refusing_sbatch)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "sbatch-calls").read_text() == "called\n"
    assert proc.stderr == ("Error: sbatch refused the job: " + REFUSAL
                           + "Nothing was queued: the run folder prepared for it was removed "
                             "(`hpctrain submit --dry-run` prepares the same, to look at the "
                             "script).\n")
    assert _tree(root) == before
    listed = hpctrain("runs", "--json", env=refusing_sbatch, check=True).stdout
    assert listed.count('"run":') == 1 and '"NOT SUBMITTED"' in listed


def test_a_refused_sweep_leaves_neither_its_folder_nor_its_runs(refusing_sbatch):
    root = Path(refusing_sbatch["HPCTRAIN_RUNS_DIR"])
    proc = hpctrain("submit", "examples/tiny.yaml", "-p", "dev-slurm", "--force",
                    "--sweep", "train.lr=1e-3,2e-3", env=refusing_sbatch)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Error: sbatch refused the sweep's job array: sbatch: error:")
    assert proc.stderr.endswith("Nothing was queued: the sweep's folder and its 2 run folders "
                                "were removed (`hpctrain submit --dry-run` prepares the same, "
                                "to look at the script).\n")
    assert [p.name for p in root.iterdir()] == ["sweeps"]
    assert list((root / "sweeps").iterdir()) == []


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_checkpoint_folder_that_cannot_be_made_is_one_line_and_leaves_no_run(
        refusing_sbatch, tmp_path, sweep):
    # /proc/self takes no new folder or file, for root too: the claim before the first job
    # fails, so nothing reaches sbatch, and the folders this submission made are removed
    root = Path(refusing_sbatch["HPCTRAIN_RUNS_DIR"])
    hpctrain("submit", "examples/tiny.yaml", "--dry-run", env=refusing_sbatch, check=True)
    before = _tree(root)                     # another run, prepared earlier: never touched
    args = ["--sweep", "train.lr=1e-3,2e-3"] if sweep else []
    proc = hpctrain("submit", "examples/tiny.yaml", "-p", "dev-slurm", "--force",
                    "--set", "checkpoint.dir=/proc/self/ck", *args, env=refusing_sbatch)
    one_error_line(proc, "does not exist", "cannot be made this run's checkpoint folder",
                   "point checkpoint.dir (or the profile's storage.checkpoint_root) at a folder")
    assert not (tmp_path / "sbatch-calls").exists()
    after = {k: v for k, v in _tree(root).items() if k != "sweeps"}
    assert after == before


def test_a_refused_run_is_removed_only_while_it_holds_what_a_submission_wrote(tmp_path):
    """The removal is for this submission's own folder: one that records a job, or holds a
    file or a log the submission did not write, is kept (nothing in it is lost)."""
    run = RunFolder(tmp_path / "runs" / "tiny-gpt-20260101-000000-abcd")
    (run.path / "logs").mkdir(parents=True)
    (run.path / "checkpoints").mkdir()
    (run.path / "submitit").mkdir()
    (run.path / "submitit" / "job.pkl").write_bytes(b"pickle")
    run.update_meta(run_id=run.id, jobs=[])
    for name in ("job.yaml", "profile.yaml", "sbatch.sh"):
        (run.path / name).write_text("x\n")
    assert holds_only(run.path, PREPARED_RUN)
    for extra in ("notes.txt", "logs/attempt-1", "checkpoints/step-00000010"):
        (run.path / extra).mkdir()
        assert not remove_refused_run(run) and run.path.exists(), extra
        (run.path / extra).rmdir()
    run.add_job_id("4242", kind="train")
    assert not remove_refused_run(run) and run.path.exists()
    run.update_meta(jobs=[])
    assert remove_refused_run(run) and not run.path.exists()
    assert list(run.path.parent.iterdir()) == []


def test_a_refused_run_whose_logs_or_checkpoints_are_links_is_kept(tmp_path):
    """``logs`` or ``checkpoints`` that is a link (even to an empty folder) is not what a
    submission writes: the folder is kept, and the link's target too."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("logs", "checkpoints"):
        run = RunFolder(tmp_path / "runs" / f"tiny-gpt-20260101-000000-{name[:4]}")
        run.path.mkdir(parents=True)
        run.update_meta(run_id=run.id, jobs=[])
        (run.path / name).symlink_to(elsewhere)
        assert not holds_only(run.path, PREPARED_RUN)
        assert not remove_refused_run(run) and run.path.exists() and elsewhere.is_dir()


def test_a_refused_run_that_cannot_be_removed_is_said_to_be_kept(refusing_sbatch, tmp_path,
                                                                 monkeypatch):
    """Removing may fail (a file system gone read-only, a folder another user holds open):
    sbatch's refusal is still what the user is told, and the folder is said to be kept."""
    from hpctrain import submission
    from hpctrain.submission import folders

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(folders, "remove_run_folder", refuse)
    monkeypatch.setenv("PATH", refusing_sbatch["PATH"])
    root = tmp_path / "runs"
    with pytest.raises(submission.SubmissionError) as refused:
        submission.submit(str(REPO / "examples" / "tiny.yaml"), profile="dev-slurm",
                          force=True, runs_dir=root)
    assert str(refused.value).startswith("sbatch refused the job: " + REFUSAL)
    assert str(refused.value).endswith("Nothing was queued: the run folder prepared for it was "
                                       "kept: more than this submission wrote is there, or "
                                       "removing failed (`hpctrain runs rm` removes a run).")
    assert len(list(root.iterdir())) == 1


def test_a_refused_run_whose_run_yaml_is_damaged_is_kept(tmp_path):
    run = RunFolder(tmp_path / "runs" / "tiny-gpt-20260101-000000-abcd")
    run.path.mkdir(parents=True)
    run.run_file.write_text("jobs: [unclosed\n")
    assert not remove_refused_run(run) and run.run_file.read_text() == "jobs: [unclosed\n"


@pytest.mark.parametrize("extra_in", ["run", "sweep"])
def test_a_refused_sweep_says_its_folders_were_kept_when_one_holds_more(refusing_sbatch,
                                                                        monkeypatch, extra_in):
    """A run folder or the sweep's own folder holding more than the submission wrote is kept,
    and the message says so (it must not say they were removed)."""
    from hpctrain import submission
    real_prepare = submission.prepare_sweep

    def prepare_and_add(*args, **kwargs):       # as if another hand wrote there meanwhile
        sweep_dir, runs = real_prepare(*args, **kwargs)
        target = runs[-1].run.path if extra_in == "run" else sweep_dir
        (target / "notes.txt").write_text("mine")
        return sweep_dir, runs
    monkeypatch.setattr(submission, "prepare_sweep", prepare_and_add)
    monkeypatch.setenv("PATH", refusing_sbatch["PATH"])
    root = Path(refusing_sbatch["HPCTRAIN_RUNS_DIR"])
    with pytest.raises(submission.SubmissionError) as refused:
        submission.submit(str(REPO / "examples" / "tiny.yaml"), profile="dev-slurm",
                          force=True, runs_dir=root, sweep=["train.lr=1e-3,2e-3"])
    assert str(refused.value).endswith(
        "Nothing was queued: the sweep's folder and its 2 run folders were kept: more than "
        "this submission wrote is there, or removing failed (`hpctrain runs rm` removes a "
        "run).")
    (notes,) = [p for p in root.rglob("notes.txt")]
    assert notes.read_text() == "mine"
    assert len([p for p in root.iterdir() if (p / "run.yaml").is_file()]) == 2   # all kept
    assert len(list((root / "sweeps").iterdir())) == 1


def test_bench_scaling_says_what_sbatch_said_and_that_nothing_was_queued(refusing_sbatch,
                                                                          tmp_path):
    """``bench scaling`` submits each size through submit's library: a refusal reads as
    submit's, and the size's run folder is gone."""
    root = Path(refusing_sbatch["HPCTRAIN_RUNS_DIR"])
    proc = hpctrain("bench", "scaling", "examples/tiny.yaml", "-p", "dev-slurm", "--nodes",
                    "2,4", "--steps", "8", "--warmup", "2", env=refusing_sbatch)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "sbatch-calls").read_text() == "called\n"   # the first size only
    assert proc.stderr.endswith(REFUSAL + "Nothing was queued: the run folder prepared for it "
                                "was removed (`hpctrain submit --dry-run` prepares the same, "
                                "to look at the script).\n"), proc.stderr
    assert not root.exists() or not any(root.iterdir())
