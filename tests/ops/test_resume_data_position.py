"""``hpctrain resume`` refuses data settings that would give the newest checkpoint's data
position another meaning (``--set`` or the run's job file edited): exit 2, one line naming the
field and the fix, nothing written and nothing asked of Slurm. What keeps the position's
meaning (the batch size here) resumes. Slurm's commands are ``tests/scheduler/fake_slurm.py``'s;
the checkpoint is published with the runtime's store functions and the fingerprint the runtime
records (``data.fingerprint``)."""

from __future__ import annotations

import pytest

from hpctrain.config import yamlio
from hpctrain.errors import UsageError
from hpctrain.data.fingerprint import data_fingerprint
from hpctrain.data.order import FEISTEL
from hpctrain.ops.control import resume_run
from tests.conftest import token_corpus
from tests.ops.helpers import cli, crafted_run, record, write_checkpoint
from tests.scheduler.fake_slurm import FakeSlurm



def fix(run) -> str:
    return (f"resume with the saved data settings, or accept the change with `hpctrain resume "
            f"{run.id} --accept-data-change`")


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> FakeSlurm:
    return FakeSlurm(tmp_path, monkeypatch)


def stopped_run(root, blend=None):
    """A run stopped at step 22 with a checkpoint of step 20 (80 samples consumed) recording
    its job's data fingerprint; ``blend``: its job's corpora instead of data.path."""
    run = crafted_run(root, ledger=[record(1, 0, 22, "failed", False, saved=20)],
                      metrics=[{"step": 22, "loss": 3.0}])
    if blend is not None:
        set_blend(run, blend)
    write_checkpoint(run.checkpoint_dir(), 20, attempt=1, run_id=run.id, consumed_samples=80,
                     data=data_fingerprint(run.resolved_job(), FEISTEL))
    return run


def set_blend(run, blend) -> None:
    """The run's job file edited by hand: its corpora and weights."""
    job = yamlio.read_mapping(run.job_file)
    job["data"].update(path=None, prepare_from=[],
                       blend=[{"path": p, "weight": w} for p, w in blend])
    yamlio.write_atomic(run.job_file, yamlio.dump(job))


def files_of(run) -> dict:
    return {str(p.relative_to(run.path)): p.read_bytes() for p in sorted(run.path.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("option, line", [
    ("train.seed=7", "train.seed: changed since checkpoint step-00000020 (seed 1234 -> 7): "
                     "position 80 would skip or repeat samples"),
    ("data.split=98/1/1", "data.split: changed since checkpoint step-00000020 (split none -> "
                          "0.98,0.01,0.01): position 80 would skip or repeat samples and "
                          "documents would move between training and evaluation"),
    ("model.seq_length=32", "model.seq_length: changed since checkpoint step-00000020 (seq "
                            "length 64 -> 32): position 80 would skip or repeat samples"),
])
def test_resume_set_of_a_data_setting_is_refused_and_nothing_changes(tmp_path, slurm, option,
                                                                      line):
    run = stopped_run(tmp_path)
    before = files_of(run)
    res = cli(tmp_path, "resume", run.id, "--set", option, check=False)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"Error: {line}; {fix(run)}"]
    assert files_of(run) == before and slurm.acted() == []


def test_an_edited_blend_is_refused_and_a_batch_size_change_resumes(tmp_path, slurm):
    other = token_corpus(tmp_path / "other", 30, 50)
    kjv = yamlio.read_mapping(crafted_run(tmp_path).job_file)["data"]["path"]
    run = stopped_run(tmp_path, blend=[(kjv, 1), (other, 1)])
    set_blend(run, [(kjv, 9), (other, 1)])
    before = files_of(run)
    res = cli(tmp_path, "resume", run.id, check=False)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"Error: data.blend: changed since checkpoint step-00000020 (weights 0.5/0.5 -> "
        f"0.9/0.1): position 80 would skip or repeat samples; {fix(run)}"]
    assert files_of(run) == before and slurm.acted() == []
    set_blend(run, [(kjv, 2), (other, 2)])         # the same shares: the same positions
    got = resume_run(run, overrides={"batch.global_batch_size": 8})
    assert got.from_step == 20 and [a[0] for a in slurm.acted()] == ["sbatch"]


def test_an_accepted_change_resumes_once_and_is_recorded_for_that_checkpoint(tmp_path, slurm):
    """``--accept-data-change``: the resume goes ahead and the run's events say so, naming the
    checkpoint (the ranks read it there); a requeue from the same checkpoint needs no second
    acceptance; a later checkpoint records the new settings and is compared under them."""
    run = stopped_run(tmp_path)
    got = resume_run(run, overrides={"train.seed": 7}, accept_data_change=True)
    assert got.from_step == 20 and [a[0] for a in slurm.acted()] == ["sbatch"]
    accepted = [e for e in run.events() if e["event"] == "data_change_accepted"]
    assert [e["checkpoint"] for e in accepted] == ["step-00000020"]
    from hpctrain.ops.control import check_data_position
    assert check_data_position(run, run.resolved_job()) is None      # accepted before
    write_checkpoint(run.checkpoint_dir(), 30, attempt=2, run_id=run.id, consumed_samples=120,
                     data=data_fingerprint(run.resolved_job(), FEISTEL))   # seed 7 recorded
    assert check_data_position(run, run.resolved_job()) is None
    with pytest.raises(UsageError, match=r"train.seed: changed since checkpoint step-00000030 "
                                        r"\(seed 7 -> 8\)"):
        resume_run(run, overrides={"train.seed": 8}, force=True)


def test_changed_validation_corpora_resume_with_a_warning(tmp_path, slurm):
    other = token_corpus(tmp_path / "other", 30, 50)
    run = stopped_run(tmp_path)
    job = yamlio.read_mapping(run.job_file)
    job["data"].update(split=None, valid_blend=[{"path": other, "weight": 1}])
    yamlio.write_atomic(run.job_file, yamlio.dump(job))
    res = cli(tmp_path, "resume", run.id, check=False)
    assert res.returncode == 0, res.stderr
    assert "warning: data.valid_blend: changed since checkpoint step-00000020 (valid set from " \
           "the split -> its own corpora): the evaluation losses from here on do not continue " \
           "the run's curve" in res.stderr
