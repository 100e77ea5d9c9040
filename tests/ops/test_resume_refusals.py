"""A resume that is refused changes nothing: the checks of the run's checkpoint folder (its own,
not another run's; ``latest`` and ``owner.json`` files every save can rewrite) come before the
run's job and profile are archived and rewritten for ``--steps``/``--set``/``--profile``, and a
FIFO where a save writes is found here, not by the ranks after the queue and the steps before
their first save."""

from __future__ import annotations

import json
import os

import pytest

from hpctrain.record import checkpoint_store as store
from tests.ops.helpers import cli, crafted_run

STOPPED = {"attempt": 1, "job_id": "1", "start_step": 0, "end_step": 10,
           "exit_reason": "preempted", "exit_code": 75}


def _snapshot(folder) -> dict:
    """Every entry under ``folder``: a file's bytes, or what else it is."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        out[rel] = path.read_bytes() if path.is_file() and not path.is_fifo() else \
            ("fifo" if path.is_fifo() else "folder")
    return out


def _owner_of_another_run(ckpt):
    record = json.loads((ckpt / store.OWNER).read_text())
    (ckpt / store.OWNER).write_text(json.dumps(dict(record, run="someone-else-1")))


@pytest.mark.parametrize("damage, said", [
    (lambda ck: (ck / store.OWNER).write_text("{garbage"), "owner.json cannot be read"),
    (_owner_of_another_run, "owner.json names run someone-else-1"),
    (lambda ck: ((ck / store.LATEST).unlink(), os.mkfifo(ck / store.LATEST)),
     "latest is a FIFO, not a regular file; move it away (every save rewrites it)"),
    (lambda ck: ((ck / store.OWNER).unlink(), os.mkfifo(ck / store.OWNER)),
     "owner.json cannot be read (is a FIFO, not a regular file"),
], ids=["owner-unreadable", "owner-another-run", "latest-fifo", "owner-fifo"])
def test_a_refused_resume_leaves_the_run_folder_as_it_was(tmp_path, damage, said):
    root = tmp_path / "runs"
    run = crafted_run(root, ledger=[STOPPED], checkpoints=[10])
    ckpt = run.checkpoint_dir()
    store.claim(ckpt, run.id, run.path)
    damage(ckpt)
    before = _snapshot(run.path)
    for extra in (["--steps", "40"], ["--set", "train.lr=0.001"], []):
        refused = cli(root, "resume", run.id, *extra, check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        (line,) = refused.stderr.splitlines()
        assert line.startswith("Error: ") and said in line, line
        assert _snapshot(run.path) == before, extra
