"""Parsers of Slurm's output, on real captured output (tests/fixtures/slurm/README.md)."""

import pytest
from hypothesis import given, strategies as st

from hpctrain.errors import HpcTrainError
from hpctrain.scheduler.slurm import commands
from hpctrain.scheduler.slurm.commands import (parse_sacct, parse_scontrol_record, parse_squeue,
                                               parse_step_ids)
from hpctrain.scheduler.backend import JobState
from tests.conftest import REPO

FIX = REPO / "tests" / "fixtures" / "slurm"


def test_parse_squeue_running_and_pending():
    pending, running = parse_squeue((FIX / "squeue_running_pending.txt").read_text())
    assert (running.job_id, running.state, running.nodes, running.time_limit) == \
        ("16", "RUNNING", "n[1-2]", "5:00")
    assert (pending.state, pending.reason, pending.nodes) == ("PENDING", "Resources", "")
    assert JobState(pending.job_id, pending.state).active


def test_parse_sacct_rows_and_states():
    rows = parse_sacct((FIX / "sacct_parsable2.txt").read_text())
    jobs = {r["JobID"]: r for r in rows}
    assert jobs["6"]["State"] == "COMPLETED" and jobs["6.0"]["NodeList"] == "n[1-2]"
    assert jobs["16"]["State"] == "CANCELLED by 0"
    assert not JobState("16", jobs["16"]["State"]).active
    assert jobs["16.batch"]["ExitCode"] == "0:15"


def test_parse_scontrol_records():
    node = parse_scontrol_record((FIX / "scontrol_show_node.txt").read_text())
    assert node["NodeName"] == "n1" and node["NodeAddr"] == "127.0.0.1" and node["Gres"] == "gpu:4"
    job = parse_scontrol_record((FIX / "scontrol_show_job.txt").read_text())
    assert job["JobState"] == "RUNNING" and job["NumNodes"] == "2"


SRUN_LOG = """[hpctrain] attempt 1 of run /runs/x: job 51 restart 0 on n[1-2]; MASTER_ADDR=127.0.0.1:36669
srun: error: n2: task 2: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=51.0
srun: error: n1: tasks 0-1: Terminated
srun: Force Terminated StepId=51.0
[hpctrain] training step exited with 143 at 01:08:11
"""


def test_srun_task_exits_say_which_task_failed_first():
    from hpctrain.scheduler.slurm.commands import parse_srun_task_exits, step_exit_code
    exits = parse_srun_task_exits(SRUN_LOG)
    assert exits == [{"node": "n2", "tasks": "2", "exit_code": 1, "signal": None},
                     {"node": "n1", "tasks": "0-1", "exit_code": None, "signal": "Terminated"}]
    assert step_exit_code(143, exits) == 1          # srun's 143 hides the real failure
    assert step_exit_code(0, []) == 0 and step_exit_code(137, []) == 137
    assert step_exit_code(75, exits) == 75          # a real code is kept


def test_parse_step_ids_keeps_the_task_steps():
    # the hang watcher kills the training step, never the batch shell's own step
    assert parse_step_ids((FIX / "squeue_steps.txt").read_text()) == ["192.0"]


def test_ranks_exiting_75_one_after_the_other_keep_the_preempted_code():
    """With ``--kill-on-bad-exit`` srun ends the step when the first rank exits 75 and reports
    143 for the ranks it terminated: the step still ended because of preemption."""
    from hpctrain.exit_codes import ExitReason, reason_for
    from hpctrain.scheduler.slurm.commands import parse_srun_task_exits, step_exit_code
    log = ("srun: error: n1: task 0: Exited with exit code 75\n"
           "srun: error: n2: tasks 2-3: Terminated\n"
           "srun: error: n1: task 1: Exited with exit code 75\n")
    exits = parse_srun_task_exits(log)
    assert [e["exit_code"] for e in exits] == [75, None, 75]
    assert reason_for(step_exit_code(143, exits)) == ExitReason.PREEMPTED


def test_a_job_that_lost_a_node_is_in_its_last_accounting_row(monkeypatch, tmp_path):
    """A --no-kill job that lost a node has a RESIZING row (the allocation before) and then its
    real one: once squeue has forgotten it, its state is the last row's, not RESIZING (which
    would keep it 'active' for ever)."""
    from hpctrain.record.folder import RunFolder
    from hpctrain.scheduler.backend import JobRef
    from hpctrain.scheduler.slurm import commands
    from hpctrain.scheduler.slurm.backend import SlurmBackend
    rows = parse_sacct((FIX / "sacct_resized_no_kill_job.txt").read_text())
    assert [r["State"] for r in rows if r["JobID"] == "4"] == ["RESIZING", "COMPLETED"]
    monkeypatch.setattr(commands, "squeue", lambda ids: [])
    monkeypatch.setattr(commands, "sacct", lambda ids: rows)
    state = SlurmBackend().job_states([JobRef(RunFolder(tmp_path), "4")])["4"]
    assert (state.state, state.nodes, state.active) == ("COMPLETED", "n[1,3]", False)


# ------------------------------------------------------------- job ids into acting commands
@pytest.mark.parametrize("job_id", ["177", "177_3", "177_[0-3]", "177_[1,4-6]", "177.0",
                                    "177+1"])
def test_a_slurm_job_id_passes_the_door_unchanged(job_id):
    assert commands.acted_on([job_id]) == [job_id]


@pytest.mark.parametrize("job_id", ["--user=alice", "-1", "", " 177", "177 178", "177=1",
                                    "abc", "177;id", "177\n178", "1" * 201, 177, None])
def test_anything_else_never_reaches_scancel_or_scontrol(job_id, monkeypatch):
    """A run record edited to hold ``--user=alice`` as its job id would, passed to scancel,
    cancel every job of that user: each command that acts on jobs refuses it before any
    process is started."""
    started = []
    monkeypatch.setattr(commands, "run", lambda argv, **kw: started.append(argv))
    for act in (lambda: commands.cancel([job_id]), lambda: commands.requeue(job_id),
                lambda: commands.exclude_nodes(job_id, ["n1"]),
                lambda: commands.resize_pending_job(job_id, nodes=1)):
        with pytest.raises(HpcTrainError, match="is not a Slurm job id"):
            act()
    assert started == []


@given(st.text(max_size=30))
def test_what_the_door_lets_through_cannot_be_an_option_or_a_setting(text):
    try:
        (job_id,) = commands.acted_on([text])
    except HpcTrainError:
        return
    assert job_id[0].isdigit() and "=" not in job_id and not any(c.isspace() for c in job_id)
