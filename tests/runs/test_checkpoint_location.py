"""Where a run's checkpoints may go (``checkpoint_store.location_problem``): never inside
another run's folder, never a folder of run folders. Refused at submission (before anything is
created) and again when a job claims the folder; nothing on disk changes."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.record import checkpoint_store as store
from hpctrain.record.folder import iter_runs
from tests.conftest import REPO

JOB = str(REPO / "examples" / "tiny.yaml")


def _dry_run(root, *sets):
    args = ["submit", JOB, "--dry-run", "--runs-dir", str(root)]
    for s in sets:
        args += ["--set", s]
    return CliRunner().invoke(cli, args)


def _tree(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), path)
                  for d, dirs, files in os.walk(path) for n in dirs + files)


@pytest.fixture
def other(tmp_path):
    """A run folder another submission made, and its files as they are."""
    assert _dry_run(tmp_path / "runs").exit_code == 0
    (run,) = iter_runs(tmp_path / "runs")
    return run


@pytest.mark.parametrize("where, said", [
    (lambda o, t: o.path, "is another run's folder"),
    (lambda o, t: o.path / "checkpoints", "is inside"),
    (lambda o, t: o.path / "logs" / "deep" / "er", "is inside"),
    (lambda o, t: t / "runs", "is the folder of run folders"),
    (lambda o, t: t, "holds run folders"),
])
def test_a_checkpoint_dir_among_runs_is_refused_before_anything_is_created(other, tmp_path,
                                                                            where, said):
    target = where(other, tmp_path)
    before = _tree(tmp_path)
    result = _dry_run(tmp_path / "runs", f"checkpoint.dir={target}")
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: checkpoint.dir: {target} ") and said in line
    assert line.endswith("point it at a folder of its own (or leave it unset: each run keeps "
                         "its checkpoints in its own folder)")
    assert _tree(tmp_path) == before          # no run folder made, nothing written


def test_a_folder_holding_a_link_to_a_run_says_it_is_a_link(other, tmp_path):
    """It was called a folder that "holds run folders"."""
    target = tmp_path / "ck"
    target.mkdir()
    (target / "pointer").symlink_to(other.path)
    result = _dry_run(tmp_path / "runs", f"checkpoint.dir={target}")
    assert result.exit_code == 2
    assert f"{target} holds a link to a run folder (pointer -> {other.path})" in result.output


def test_a_link_into_another_run_is_followed(other, tmp_path):
    (tmp_path / "innocent").symlink_to(other.path)
    result = _dry_run(tmp_path / "runs", f"checkpoint.dir={tmp_path / 'innocent' / 'ck'}")
    assert result.exit_code == 2 and "another run's folder" in result.output


def test_the_claim_refuses_it_too_and_allows_the_runs_own_places(other, tmp_path):
    """A job claims its folder before it is queued and again when rank 0 resumes: a run
    folder made before this check, or a path changed since, is refused there too."""
    with pytest.raises(store.ForeignCheckpointsError, match="another run's folder"):
        store.claim(other.path / "ck", "tiny-gpt-new", tmp_path / "runs" / "tiny-gpt-new")
    assert not (other.path / "ck").exists()
    with pytest.raises(store.ForeignCheckpointsError, match="is this run's folder"):
        store.claim(other.path, other.id, other.path)
    assert not (other.path / store.OWNER).exists()
    # its own checkpoints folder, and a folder of its own elsewhere
    assert store.claim(other.path / "checkpoints", other.id, other.path)
    assert store.claim(tmp_path / "ckpt" / other.id, other.id, other.path)


def test_a_checkpoint_dir_of_its_own_is_accepted(tmp_path):
    result = _dry_run(tmp_path / "runs", f"checkpoint.dir={tmp_path / 'ckpt' / 'exp1'}")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("make, at, said", [
    (lambda p: p.write_text("keep"), "", "is a file, not a folder"),
    (lambda p: p.write_text("keep"), "sub/ck", "which is a file, not a folder"),
    (lambda p: os.mkfifo(p), "", "is a FIFO, not a folder"),
    (lambda p: p.symlink_to("/dev/null"), "", "is a character device, not a folder"),
])
def test_a_checkpoint_dir_that_is_not_a_folder_is_refused_before_anything_is_created(
        tmp_path, make, at, said):
    """A file where the folder is to be (or on its path) was accepted: the claim's mkdir failed
    quietly and the job was queued, to fail at its first save. Refused at submission, the file
    untouched, and at the claim."""
    thing = tmp_path / "thing"
    make(thing)
    target = thing / at if at else thing
    before = _tree(tmp_path)
    result = _dry_run(tmp_path / "runs", f"checkpoint.dir={target}")
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: checkpoint.dir: ") and said in line, line
    assert _tree(tmp_path) == before
    if thing.is_file() and not thing.is_symlink():
        assert thing.read_text() == "keep"
    with pytest.raises(store.ForeignCheckpointsError, match="not a folder"):
        store.claim(target, "tiny-gpt-new", tmp_path / "runs" / "tiny-gpt-new")


def _profile_with_root(tmp_path, root) -> str:
    """dev-slurm with ``storage.checkpoint_root: root``, written outside the runs."""
    text = (REPO / "cluster_profiles" / "dev-slurm.yaml").read_text()
    assert "checkpoint_root: null" in text
    path = tmp_path / "profiles" / "p.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace("checkpoint_root: null", f"checkpoint_root: {root}"))
    return str(path)


@pytest.mark.parametrize("where, said", [
    (lambda o, t: o.path, "is another run's folder"),
    (lambda o, t: o.path / "checkpoints", "is inside"),
    (lambda o, t: t / "runs", "run folder"),   # validate: "holds run folders"
    (lambda o, t: t / "afile" / "x", "which is a file, not a folder"),
    (lambda o, t: t / "loop", "is a symlink loop, not a folder"),
    (lambda o, t: t / "loop" / "x", "which is a symlink loop, not a folder"),
])
@pytest.mark.parametrize("sweep", [False, True])
def test_a_profiles_checkpoint_root_goes_through_the_same_check(other, tmp_path, where, said,
                                                                 sweep):
    """``storage.checkpoint_root`` decides the checkpoint folder (``<root>/<run id>``) when
    the job sets no ``checkpoint.dir``: it was never checked, and a root inside another run's
    folder, under a file or through a symlink loop was taken by validate and submit alike
    (run.yaml recorded ``<other run>/<new id>``). Refused by both, naming the field, before
    anything is created, for a single run and for every sweep point."""
    (tmp_path / "afile").write_text("keep")
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    root = where(other, tmp_path)
    profile = _profile_with_root(tmp_path, root)
    before = _tree(tmp_path)
    args = ["submit", JOB, "--dry-run", "--runs-dir", str(tmp_path / "runs"), "-p", profile]
    if sweep:
        args += ["--sweep", "train.lr=1e-3,2e-3"]
    for result in (CliRunner().invoke(cli, args),
                   CliRunner().invoke(cli, ["validate", JOB, "-p", profile])):
        assert result.exit_code == 2, result.output
        (line,) = result.output.strip().splitlines()
        assert line.startswith(f"Error: storage.checkpoint_root: {root} ") and said in line
        assert line.endswith("point it at a folder of its own (or set it to null: each run "
                             "keeps its checkpoints in its own folder)")
    assert _tree(tmp_path) == before
    assert (tmp_path / "afile").read_text() == "keep"


def test_a_checkpoint_root_of_its_own_holds_each_runs_folder(tmp_path):
    profile = _profile_with_root(tmp_path, tmp_path / "ckroot")
    assert CliRunner().invoke(cli, ["validate", JOB, "-p", profile]).exit_code == 0
    result = CliRunner().invoke(cli, ["submit", JOB, "--dry-run", "-p", profile,
                                      "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    (run,) = iter_runs(tmp_path / "runs")
    assert run.meta()["checkpoint_dir"] == str(tmp_path / "ckroot" / run.id)


def test_a_relative_checkpoint_root_is_recorded_absolute(tmp_path, monkeypatch):
    """A relative root is relative to the folder the run is created from (as a relative runs
    root is): run.yaml recorded it relative, and the ranks, which run in the run folder, would
    have read it from there."""
    monkeypatch.chdir(tmp_path)
    profile = _profile_with_root(tmp_path, "ckroot")
    result = CliRunner().invoke(cli, ["submit", JOB, "--dry-run", "-p", profile,
                                      "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    (run,) = iter_runs(tmp_path / "runs")
    assert run.meta()["checkpoint_dir"] == str(tmp_path / "ckroot" / run.id)
    monkeypatch.chdir(run.path)                                   # where the ranks run
    assert run.checkpoint_dir() == tmp_path / "ckroot" / run.id


@pytest.mark.parametrize("at", ["", "x"])
def test_a_checkpoint_dir_through_a_symlink_loop_is_one_line(tmp_path, at):
    """Resolving it raised RuntimeError: an internal error, exit 1."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    target = tmp_path / "loop" / at if at else tmp_path / "loop"
    result = _dry_run(tmp_path / "runs", f"checkpoint.dir={target}")
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "checkpoint.dir: " in line and "symlink loop" in line, line
    assert not (tmp_path / "runs").exists()


def test_validate_checks_the_checkpoint_dir_as_submit_does(other, tmp_path, monkeypatch):
    """validate called such a job ok, and submit refused it."""
    monkeypatch.setenv("HPCTRAIN_RUNS_DIR", str(tmp_path / "runs"))
    result = CliRunner().invoke(cli, ["validate", JOB, "--set", f"checkpoint.dir={other.path}"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: checkpoint.dir: {other.path} is another run's")


def test_validate_checks_the_checkpoint_dir_against_the_runs_dir_it_is_given(tmp_path,
                                                                             monkeypatch):
    """validate checked against the default runs root only: a checkpoint.dir that is the
    --runs-dir submit then refused was called ok."""
    monkeypatch.delenv("HPCTRAIN_RUNS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "team-runs"
    args = ["validate", JOB, "--set", f"checkpoint.dir={runs}"]
    assert CliRunner().invoke(cli, args).exit_code == 0           # ./runs is another folder
    refused = CliRunner().invoke(cli, [*args, "--runs-dir", str(runs)])
    assert refused.exit_code == 2, refused.output
    assert refused.output == (f"Error: checkpoint.dir: {runs} is the folder of run folders; "
                              f"point it at a folder of its own (or leave it unset: each run "
                              f"keeps its checkpoints in its own folder)\n")
    submitted = CliRunner().invoke(cli, ["submit", *args[1:], "--runs-dir", str(runs),
                                         "--dry-run"])
    assert submitted.exit_code == 2 and submitted.output == refused.output


def _owned_by_another_run(folder):
    """``folder`` claimed by another run, which saved step 5 there."""
    from tests.ops.helpers import write_checkpoint
    store.claim(folder, "someone-else-20260101-000000-abcd")
    write_checkpoint(folder, 5, attempt=1, run_id="someone-else-20260101-000000-abcd")
    return _tree(folder)


def test_a_run_on_another_runs_checkpoint_folder_is_refused_before_anything_is_created(
        tmp_path):
    theirs = tmp_path / "theirs"
    before = _owned_by_another_run(theirs)
    result = _dry_run(tmp_path / "runs", f"checkpoint.dir={theirs}")
    assert result.exit_code == 2
    assert f"checkpoint.dir: {theirs} holds another run's checkpoints (owner.json names run " \
        "someone-else-20260101-000000-abcd)" in result.output
    assert not (tmp_path / "runs").exists() and _tree(theirs) == before


def test_a_sweeps_runs_each_keep_a_new_folder_under_a_checkpoint_dir_of_any_owner(tmp_path):
    """A sweep's runs save in ``<checkpoint.dir>/<run id>``, new and empty: who owns the
    folder above (or what its ``latest`` is) is not theirs to check, and its files stay."""
    theirs = tmp_path / "theirs"
    before = _owned_by_another_run(theirs)
    result = CliRunner().invoke(cli, ["submit", JOB, "--dry-run", "--runs-dir",
                                      str(tmp_path / "runs"), "--set",
                                      f"checkpoint.dir={theirs}", "--sweep",
                                      "train.lr=1e-3,2e-3"])
    assert result.exit_code == 0, result.output
    runs = list(iter_runs(tmp_path / "runs"))
    assert sorted(r.meta()["checkpoint_dir"] for r in runs) == \
        sorted(str(theirs / r.id) for r in runs)
    assert _tree(theirs) == before


@pytest.mark.parametrize("profile", ["local", "dev-slurm"])
def test_a_sweep_of_one_value_is_a_sweep_of_one_run_named_after_the_job(tmp_path, profile):
    """The dry run says what it made: one run folder, and a script only where there is one
    (a job array on Slurm; a local sweep trains its runs one by one and has none)."""
    result = CliRunner().invoke(cli, ["submit", JOB, "--dry-run", "-p", profile, "--force",
                                      "--runs-dir", str(tmp_path / "runs"),
                                      "--sweep", "train.lr=1e-3"])
    assert result.exit_code == 0, result.output
    (sweep,) = (tmp_path / "runs" / "sweeps").iterdir()
    (run,) = iter_runs(tmp_path / "runs")
    assert sweep.name.startswith("tiny-gpt-") and run.meta()["sweep"]["dir"] == str(sweep)
    said = result.output.splitlines()[-2]
    script = f" Script: {sweep / 'sbatch.sh'}" if profile == "dev-slurm" else ""
    assert said == f"Dry run: sweep {sweep.name} prepared (1 run folder); nothing " \
        f"submitted.{script}"
    assert (sweep / "sbatch.sh").is_file() == (profile == "dev-slurm")


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_latest_no_save_could_rewrite_refuses_a_run_but_not_a_sweep(tmp_path, sweep):
    """A run saves into ``checkpoint.dir`` and rewrites its ``latest``: a link there is refused
    before anything is created. A sweep's runs save in ``<checkpoint.dir>/<run id>``, so the
    ``latest`` above is not theirs."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "latest").symlink_to(tmp_path / "elsewhere")
    args = ["submit", JOB, "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--set",
            f"checkpoint.dir={ck}"] + (["--sweep", "train.lr=1e-3,2e-3"] if sweep else [])
    result = CliRunner().invoke(cli, args)
    if sweep:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2
        assert f"checkpoint folder {ck}: latest is a symbolic link" in result.output, \
            result.output
        assert not (tmp_path / "runs").exists()
