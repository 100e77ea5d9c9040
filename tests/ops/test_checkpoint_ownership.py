"""A checkpoint folder belongs to one run, at submission: a second run of the same job file
with `checkpoint.dir` set is refused before anything is created or queued, while the first
run's own cancel and resume go on using the folder; submissions racing on one empty folder get
one owner and the refused ones leave no run folder behind; a sweep gives every run a folder of
its own, and its relative paths are relative to the job file, as in the job file."""

from __future__ import annotations

import json
import os

import pytest

from hpctrain.config import yamlio
from hpctrain.record import checkpoint_store as store
from tests.conftest import REPO
from tests.ops.helpers import (OPS_JOB, cli, ops_job, ops_profile, ops_resolved, start_run,
                               wait_ledger, wait_step, wait_stopped)


def _job_file(folder, **checkpoint) -> str:
    """tests/ops/tiny-ops.yaml in ``folder`` (absolute data paths), a global batch that fits
    dev-slurm's 4 ranks, and the given checkpoint settings."""
    ops_job()                                       # the token data, prepared once
    data = yamlio.read_mapping(OPS_JOB)
    data["data"]["path"] = str(REPO / "examples" / "data" / "kjv_byte")
    data["data"]["prepare_from"] = [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]
    data["batch"]["global_batch_size"] = 8
    data["train"]["min_lr"] = 1.0e-5
    data["checkpoint"].update(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return str(path)


@pytest.fixture(scope="module")
def owned(slurm_cluster, tmp_path_factory):
    """The scenario, once: a first run claims ``checkpoint.dir``; a second submission of the
    same job file (dry run, then real) is tried; the first run is cancelled and resumed."""
    tmp_path = tmp_path_factory.mktemp("ownership")
    root = tmp_path / "runs"
    job_file = _job_file(tmp_path / "jobs", dir="../ckpt")      # relative to the job file
    ckpt = tmp_path / "ckpt"
    resolved = ops_resolved(ops_profile(step_s=0.2), steps=8, job_file=job_file)
    first, sub = start_run(root, resolved)
    s = {"root": root, "ckpt": ckpt, "resolved": resolved, "first": first,
         "owner_when_queued": store.read_owner(ckpt), "mode": ckpt.stat().st_mode & 0o777}
    s["again"] = [cli(root, "submit", job_file, "-p", "dev-slurm", *extra, check=False)
                  for extra in (["--dry-run"], [])]
    s["runs_after_refusal"] = sorted(p.name for p in root.iterdir())
    wait_step(first, 2)
    cli(root, "cancel", first.id)
    # the job ends; on a loaded machine Slurm's KillWait can end its batch shell before it
    # records the attempt, and the resumed job's first attempt then records it from the
    # attempt's own files (record_lost_attempts): either way the ledger holds it after resume
    wait_stopped(first)
    s["resume"] = cli(root, "resume", first.id, check=False)   # the same run: its own folder
    if s["resume"].returncode == 0:
        wait_ledger(first, 2, timeout=300)
        wait_stopped(first)
    s["cancelled"] = first.ledger()[0] if first.ledger() else None
    return s


@pytest.mark.slurm
@pytest.mark.megatron
def test_a_second_run_on_the_same_checkpoint_dir_is_refused_before_anything_is_created(owned):
    ckpt, first = owned["ckpt"], owned["first"]
    assert owned["resolved"].job.checkpoint.dir == str(ckpt)
    assert owned["owner_when_queued"]["run"] == first.id      # claimed as it was queued
    assert owned["mode"] == 0o700
    for again in owned["again"]:
        assert again.returncode == 2, again.stdout + again.stderr
        assert again.stderr.startswith(f"Error: checkpoint.dir: {ckpt} holds another run's "
                                       f"checkpoints (owner.json names run {first.id})")
        assert f"`hpctrain resume {first.id}`" in again.stderr
        assert f"train.init_from: {ckpt}" in again.stderr
    assert owned["runs_after_refusal"] == [first.id]             # nothing created or queued


@pytest.mark.slurm
@pytest.mark.megatron
def test_the_first_run_cancels_and_resumes_in_its_own_folder(owned):
    ckpt, first, cancelled = owned["ckpt"], owned["first"], owned["cancelled"]
    assert owned["resume"].returncode == 0, owned["resume"].stderr
    assert f"Resumed run {first.id} as job " in owned["resume"].stdout
    assert cancelled["attempt"] == 1 and cancelled["exit_reason"] == "cancelled", cancelled
    second = first.ledger()[1]
    assert second["exit_reason"] == "finished" and second["end_step"] == 8
    assert cancelled["checkpoint_saved"].startswith(str(ckpt))   # saved on the cancel's SIGTERM
    assert second["start_step"] == cancelled["end_step"]
    assert second["checkpoint_loaded"] == cancelled["checkpoint_saved"]
    assert all(store.read_manifest(d)["run"] == first.id
               for _, d in store.complete_checkpoints(ckpt))


def test_a_submission_that_loses_the_folder_after_its_check_leaves_no_run_folder(tmp_path,
                                                                                monkeypatch):
    """The race's narrow window, made to happen every time: another run claims the folder
    after this submission checked it and created its run folder, before its own claim."""
    import hpctrain.submission as submission
    ckpt, root = tmp_path / "ckpt", tmp_path / "runs"
    job_file = _job_file(tmp_path / "jobs", dir=str(ckpt))
    (root / "earlier-run").mkdir(parents=True)            # not this call's: must stay
    created = []

    def prepare_then_lose_the_folder(*args, **kwargs):
        run = real_prepare_run(*args, **kwargs)
        created.append(run.path)
        store.claim(ckpt, "rival-run")                     # the other submission wins
        return run

    real_prepare_run = submission.prepare_run
    monkeypatch.setattr(submission, "prepare_run", prepare_then_lose_the_folder)
    with pytest.raises(store.ForeignCheckpointsError, match="owner.json names run rival-run"):
        submission.submit(job_file, "dev-slurm")
    assert created and not created[0].exists()             # the run folder it made is gone
    assert sorted(p.name for p in root.iterdir()) == ["earlier-run"]
    assert store.read_owner(ckpt)["run"] == "rival-run"    # the winner's claim is untouched
    assert sorted(p.name for p in ckpt.iterdir()) == ["owner.json"]


def _submit_in_process(job_file, root, go, out):
    from hpctrain.submission import submit
    go.wait()
    try:
        out.put(("ok", submit(job_file, "dev-slurm", runs_dir=root).run.id))
    except store.ForeignCheckpointsError:
        out.put(("refused", None))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out.put(("error", f"{type(e).__name__}: {e}"))


@pytest.mark.slurm
def test_submissions_racing_on_one_empty_folder_leave_one_run_and_one_owner(slurm_cluster,
                                                                           tmp_path):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    ckpt, root = tmp_path / "ckpt", tmp_path / "runs"
    job_file = _job_file(tmp_path / "jobs", dir=str(ckpt))
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_submit_in_process, args=(job_file, root, go, out))
             for _ in range(4)]
    [p.start() for p in procs]
    go.set()
    results = [out.get(timeout=300) for _ in procs]
    [p.join(60) for p in procs]
    winners = [run_id for how, run_id in results if how == "ok"]
    try:
        assert sorted(how for how, _ in results) == ["ok", "refused", "refused", "refused"], \
            results
        assert [p.name for p in root.iterdir()] == winners        # no refused run's folder
        assert store.read_owner(ckpt)["run"] == winners[0]
    finally:
        for run_id in winners:
            cli(root, "cancel", run_id, check=False)


def test_sweep_paths_are_relative_to_the_job_file_and_each_run_has_its_own_folder(tmp_path,
                                                                                monkeypatch):
    job_file = _job_file(tmp_path / "jobs", dir="shared-ckpt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)                     # the submitting shell is somewhere else
    root = tmp_path / "runs"
    res = json.loads(cli(root, "submit", job_file, "-p", "dev-slurm", "--dry-run", "--json",
                         "--sweep", "train.lr=1e-4,3e-4",
                         "--sweep", "checkpoint.dir=ck/a,ck/b").stdout)
    assert len(res["runs"]) == 4
    folders = set()
    for r in res["runs"]:
        meta = yamlio.read_mapping(os.path.join(r["run_dir"], "run.yaml"))
        job = yamlio.read_mapping(os.path.join(r["run_dir"], "job.yaml"))
        swept = r["values"]["checkpoint.dir"]
        want = str(tmp_path / "jobs" / swept / r["run"])      # job file's folder, then run id
        assert meta["checkpoint_dir"] == want and job["checkpoint"]["dir"] == want
        folders.add(want)
    assert len(folders) == 4                          # two points per swept folder, still apart
    assert not (tmp_path / "jobs" / "ck").exists()    # a dry run claims and creates nothing
    assert not (elsewhere / "ck").exists()
    assert (root / "sweeps" / res["sweep"]).stat().st_mode & 0o777 == 0o700


def test_a_sweep_does_not_check_the_latest_of_a_folder_no_save_of_it_writes(tmp_path):
    """A sweep's runs save under ``<checkpoint.dir>/<run id>``: a ``latest`` FIFO left in
    ``checkpoint.dir`` itself is no save's, and the sweep is taken; a single run saves there,
    and is refused before anything is created."""
    ck = tmp_path / "ck"
    ck.mkdir()
    os.mkfifo(ck / store.LATEST)
    job_file = _job_file(tmp_path / "jobs", dir=str(ck))
    root = tmp_path / "runs"
    single = cli(root, "submit", job_file, "-p", "dev-slurm", "--dry-run", check=False)
    assert single.returncode == 2, single.stderr
    assert single.stderr.splitlines() == [
        f"Error: checkpoint folder {ck}: latest is a FIFO, not a regular file; move it away "
        f"(every save rewrites it)"]
    assert not root.exists()
    res = json.loads(cli(root, "submit", job_file, "-p", "dev-slurm", "--dry-run", "--json",
                         "--sweep", "train.lr=1e-4,3e-4").stdout)
    assert [r["values"] for r in res["runs"]] == [{"train.lr": 1e-4}, {"train.lr": 3e-4}]
    for r in res["runs"]:
        job = yamlio.read_mapping(os.path.join(r["run_dir"], "job.yaml"))
        assert job["checkpoint"]["dir"] == str(ck / r["run"])


def test_a_sweep_with_one_refused_checkpoint_dir_creates_nothing(tmp_path):
    """The second point's checkpoint.dir lies inside a run's folder: refused in one line before
    the sweep's folder or any run folder exists (it had left an empty sweep folder)."""
    root = tmp_path / "runs"
    job_file = _job_file(tmp_path / "jobs", dir=str(tmp_path / "ck"))
    first = json.loads(cli(root, "submit", job_file, "-p", "dev-slurm", "--dry-run",
                           "--json").stdout)
    before = sorted(p.name for p in root.rglob("*"))
    inside = os.path.join(first["run_dir"], "ck")
    refused = cli(root, "submit", job_file, "-p", "dev-slurm", "--dry-run", "--sweep",
                  f"checkpoint.dir={tmp_path / 'ok'},{inside}", check=False)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.splitlines()
    assert line.startswith("Error: checkpoint.dir: ") and "another run's folder" in line, line
    assert sorted(p.name for p in root.rglob("*")) == before
