"""``runs rm`` and ``runs prune`` delete whole folders, so their one door
(``ops.cleanup.not_removable``) and what they say about checkpoints kept elsewhere are told
here rule by rule: each story is a way a wrong folder could be deleted, a right one kept, or
the user misinformed about where the checkpoints are."""

from __future__ import annotations

import os

import pytest

from hpctrain.ops import cleanup
from tests.ops.helpers import cli, crafted_run


def _project(path, text="epochs: 3\n"):
    """Another tool's folder that happens to hold a ``run.yaml``."""
    path.mkdir(parents=True)
    (path / "run.yaml").write_text(text)
    return path


def test_prune_removes_every_dry_run_whatever_folders_sit_among_them(tmp_path):
    """A folder prune must leave alone (another tool's, a damaged run) does not stop it: the
    dry runs listed after it in the folder are removed too (the folder order is the file
    system's, so several of each are mixed)."""
    root = tmp_path / "runs"
    dry = [crafted_run(root) for _ in range(8)]
    for run in dry:
        run.update_meta(dry_run=True)
    others = [_project(root / f"project-{i}") for i in range(8)]
    removed = cli(root, "runs", "prune").stdout.splitlines()
    assert sorted(removed) == sorted(f"removed {r.path}" for r in dry)
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in others)


def test_prune_keeps_a_run_that_is_not_a_dry_run_even_with_no_job_recorded(tmp_path):
    """A run folder with no job (its submission stopped, or an older version's) is not a dry
    run: only ``dry_run: true`` with no job is what prune removes."""
    root = tmp_path / "runs"
    plain, dry = crafted_run(root), crafted_run(root)
    dry.update_meta(dry_run=True)
    assert plain.job_ids(kind=None) == [] and not plain.meta().get("dry_run")
    assert cli(root, "runs", "prune").stdout.splitlines() == [f"removed {dry.path}"]
    assert plain.path.exists()


def test_a_run_yaml_with_an_empty_run_id_is_not_a_run(tmp_path):
    root = tmp_path / "runs"
    run = crafted_run(root)
    run.update_meta(run_id="")
    refused = cli(root, "runs", "rm", str(run.path), check=False)
    assert refused.returncode == 2 and "records no run_id" in refused.stderr, refused.stderr
    assert run.path.exists()


def test_a_damaged_run_yaml_is_refused_in_one_line_naming_it(tmp_path):
    root = tmp_path / "runs"
    run = crafted_run(root)
    run.run_file.write_text("run_id: [unclosed\n")
    refused = cli(root, "runs", "rm", str(run.path), check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "has a run.yaml that cannot be read (" in refused.stderr
    assert "remove it by hand if it is a run; nothing was removed" in refused.stderr
    assert run.path.exists()


def test_a_folder_without_a_readable_run_yaml_is_not_removable():
    """The door itself, for a caller that did not list the folder first (or a run.yaml that
    went away since): it says why, and nothing is removed."""
    import tempfile
    with tempfile.TemporaryDirectory() as empty:
        why = cleanup.not_removable(__import__("pathlib").Path(empty))
    assert why == "has no readable run.yaml (No such file or directory); it is not a run folder"


def test_a_link_inside_a_run_to_another_run_is_not_another_run_inside_it(tmp_path):
    """A run folder holding a link to another run (made by hand, for convenience) is removed;
    the link goes with it and the run it points at stays, whole."""
    root = tmp_path / "runs"
    run, other = crafted_run(root), crafted_run(root)
    (run.path / "see-also").symlink_to(other.path)
    (run.path / "logs").mkdir(exist_ok=True)
    (run.path / "logs" / "other-logs").symlink_to(other.path)
    before = sorted(str(p) for p in other.path.rglob("*"))
    assert cli(root, "runs", "rm", run.id).stdout == f"removed {run.path}\n"
    assert not run.path.exists() and sorted(str(p) for p in other.path.rglob("*")) == before


def test_a_folder_that_cannot_be_listed_holds_no_run_the_door_knows_of(tmp_path, monkeypatch):
    """As root every folder can be listed; for another user a subfolder may not be. The door
    does not fail on it (it cannot see a run there, so it cannot refuse for one)."""
    run = crafted_run(tmp_path / "runs")
    (run.path / "private").mkdir()
    real_scandir = os.scandir

    def scandir(path):
        if os.path.basename(path) == "private":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)
    monkeypatch.setattr(cleanup.os, "scandir", scandir)
    assert cleanup.not_removable(run.path) is None


@pytest.mark.parametrize("where", ["checkpoints", ".", "checkpoints/deep"])
def test_checkpoints_inside_the_run_are_not_said_to_be_kept(tmp_path, where):
    root = tmp_path / "runs"
    run = crafted_run(root)
    inside = (run.path / where).resolve()
    inside.mkdir(parents=True, exist_ok=True)
    run.update_meta(checkpoint_dir=str(inside))
    assert cli(root, "runs", "rm", run.id, "--dry-run").stdout == f"would remove {run.path}\n"


@pytest.mark.parametrize("name", ["aa-ck", "zz-ck"])     # sorting before and after the run
def test_checkpoints_outside_the_run_are_said_to_be_kept_wherever_they_sort(tmp_path, name):
    root = tmp_path / "runs"
    run = crafted_run(root)
    outside = tmp_path / name / run.id
    outside.mkdir(parents=True)
    run.update_meta(checkpoint_dir=str(outside))
    assert cli(root, "runs", "rm", run.id, "--dry-run").stdout == \
        f"would remove {run.path} (checkpoints kept in {outside})\n"


def test_a_checkpoint_folder_outside_that_is_gone_is_not_said_to_be_kept(tmp_path):
    root = tmp_path / "runs"
    run = crafted_run(root)
    run.update_meta(checkpoint_dir=str(tmp_path / "never-made" / run.id))
    assert cli(root, "runs", "rm", run.id, "--dry-run").stdout == f"would remove {run.path}\n"
