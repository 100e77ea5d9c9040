"""``train.init_from`` is checked by ``validate`` and ``submit`` by the rules the ranks load it
by (``record.model_checkpoint``): a folder that holds no checkpoint, a file or a FIFO is one
error line before anything is created or queued, not a failure of every rank after the job
waited for its nodes. A path this machine cannot see is a warning where the data's would be."""

from __future__ import annotations

import os

import pytest

from tests.conftest import REPO
from tests.ops.helpers import cli, write_checkpoint

TINY = str(REPO / "examples" / "tiny.yaml")


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    return tmp_path / "pipe"


def _file(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    return tmp_path / "manifest.json"


def _empty(tmp_path):
    (tmp_path / "nothing").mkdir()
    return tmp_path / "nothing"


@pytest.mark.parametrize("make, said", [
    (_empty, "holds no complete checkpoint"),
    (_file, "is a file, not a folder"),
    (_fifo, "is a FIFO, not a folder"),
], ids=["no-checkpoint", "file", "fifo"])
def test_an_init_from_without_a_checkpoint_is_refused_before_anything_is_made(tmp_path, make,
                                                                              said):
    path = make(tmp_path)
    root = tmp_path / "runs"
    for command in (["validate", TINY], ["submit", TINY, "--no-wait"],
                    ["submit", TINY, "-p", "dev-slurm", "--dry-run"]):
        res = cli(root, *command, "--set", f"train.init_from={path}", check=False)
        assert res.returncode == 2, (command, res.stdout, res.stderr)
        (line,) = res.stderr.splitlines()
        assert line == f"Error: train.init_from: {path} {said}" + (
            "" if said.startswith("holds") else " (give a checkpoint folder, a checkpoint root "
                                                "or a model export)"), line
    assert not root.exists()


def test_a_checkpoint_root_is_taken_and_a_path_not_here_is_a_warning(tmp_path):
    root = tmp_path / "runs"
    write_checkpoint(tmp_path / "ck", 4, attempt=1, run_id="other-run")
    ok = cli(root, "validate", TINY, "--set", f"train.init_from={tmp_path / 'ck'}")
    assert "ok on local" in ok.stdout and "init_from" not in ok.stderr
    away = cli(root, "validate", TINY, "--set", f"train.init_from={tmp_path / 'elsewhere'}")
    assert "ok on local" in away.stdout
    assert f"warning: train.init_from: {tmp_path / 'elsewhere'} does not exist on this " \
           f"machine" in away.stderr
    refused = cli(root, "submit", TINY, "--no-wait", "--set",
                  f"train.init_from={tmp_path / 'elsewhere'}", check=False)
    assert refused.returncode == 2 and "does not exist" in refused.stderr
    assert not root.exists()
