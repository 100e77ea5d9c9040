"""The runners of ``scheduler/slurm/commands.py`` against Slurm's commands answering in their
captured formats (``fake_slurm.py``): what each runner asks Slurm (the argv, recorded), what it
makes of the answer, of a refusal, of a command that never answers and of one that is not
installed; and Slurm's durations in every form its grammar has."""

from __future__ import annotations

import pytest

from hpctrain.errors import HpcTrainError, SubmissionError
from hpctrain.scheduler.slurm import commands
from tests.scheduler.fake_slurm import FIXTURES, FakeSlurm


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> FakeSlurm:
    return FakeSlurm(tmp_path, monkeypatch, jobs={"41": {"NodeList": "n[1-2]", "NumNodes": "2"}},
                     steps={"41.0": "n[1-2]", "41.1": "n2"},
                     nodes={"n1": {"NodeAddr": "10.0.0.1"}, "n2": {}})


def _answer(slurm: FakeSlurm, tool: str, **canned) -> None:
    slurm.state.setdefault("answers", {})[tool] = canned
    slurm.save()


def test_a_command_that_does_not_answer_in_time_is_named_with_the_wait(slurm):
    _answer(slurm, "squeue", sleep=30)
    with pytest.raises(HpcTrainError, match=r"`squeue -h` did not answer within 1 s "
                                            r"\(is slurmctld up\?\)"):
        commands.run(["squeue", "-h"], timeout=1)


def test_a_refusal_says_what_slurm_said_or_its_exit_code(slurm):
    _answer(slurm, "scancel", err="scancel: error: Kill job error on job id 41: Access denied\n",
            rc=1)
    with pytest.raises(SubmissionError) as e:
        commands.run(["scancel", "41"])
    assert str(e.value) == ("scancel failed: scancel: error: Kill job error on job id 41: "
                            "Access denied")
    _answer(slurm, "scancel", out="only on stdout\n", rc=1)
    with pytest.raises(SubmissionError, match=r"^scancel failed: only on stdout$"):
        commands.run(["scancel", "41"])
    _answer(slurm, "scancel", rc=3)
    with pytest.raises(SubmissionError, match=r"^scancel failed with exit code 3$"):
        commands.run(["scancel", "41"])
    assert commands.run(["scancel", "41"], check=False).returncode == 3   # asked not to check
    _answer(slurm, "scancel", signal=9)             # killed: Python says -9
    with pytest.raises(SubmissionError, match=r"^scancel failed with exit code -9$"):
        commands.run(["scancel", "41"])


def test_a_command_that_is_not_installed_says_where_slurm_is(slurm, monkeypatch):
    monkeypatch.setenv("PATH", str(slurm.folder.parent))     # no Slurm command at all
    with pytest.raises(HpcTrainError, match=r"`sinfo` is not on PATH: is this a Slurm login "
                                            r"node\?"):
        commands.run(["sinfo"])


def test_sbatch_test_only_gives_slurm_s_verdict_or_its_refusal(slurm, tmp_path):
    script = str(tmp_path / "job.sbatch")
    # sbatch --test-only answers on stderr, also when it accepts
    _answer(slurm, "sbatch", err="sbatch: Job 42 to start at 2026-11-25T22:23:51 using 2 "
                                 "processors on nodes n[1-2] in partition debug\n", out="\n")
    assert commands.sbatch_test_only(script) == (
        "sbatch: Job 42 to start at 2026-11-25T22:23:51 using 2 processors on nodes n[1-2] in "
        "partition debug")
    _answer(slurm, "sbatch", err="sbatch: error: Batch job submission failed: Requested node "
                                 "configuration is not available\n", rc=1)
    with pytest.raises(SubmissionError) as e:
        commands.sbatch_test_only(script)
    assert str(e.value) == ("sbatch --test-only refused the script: sbatch: error: Batch job "
                            "submission failed: Requested node configuration is not available")
    assert slurm.calls("sbatch") == [["sbatch", "--test-only", script]] * 2


def test_squeue_reads_one_line_per_array_task_and_forgotten_ids_as_gone(slurm):
    assert commands.squeue([]) == [] and slurm.calls() == []    # nothing to ask
    (entry,) = commands.squeue(["41"])
    assert (entry.job_id, entry.state, entry.nodes, entry.num_nodes) == (
        "41", "RUNNING", "n[1-2]", "2")
    (argv,) = slurm.calls("squeue")
    assert argv[1:5] == ["-h", "-r", "-j", "41"]         # -r: array tasks one per line
    # squeue refuses an id it has forgotten (exit 1): that job is not in the queue any more
    assert commands.squeue(["77"]) == []


def test_sacct_rows_or_nothing_where_accounting_is_off(slurm):
    _answer(slurm, "sacct", out=(FIXTURES / "sacct_parsable2.txt").read_text())
    assert commands.sacct([]) == [] and slurm.calls() == []
    rows = commands.sacct(["6", "16"])
    assert [r["JobID"] for r in rows][:3] == ["6", "6.batch", "6.0"]
    assert rows[0]["State"] == "COMPLETED" and rows[0]["NodeList"] == "n[1-2]"
    commands.sacct(["6"], duplicates=True)
    first, second = slurm.calls("sacct")
    assert first == ["sacct", "--parsable2", "-o", ",".join(commands.SACCT_FIELDS), "-j", "6,16"]
    assert second[-1] == "--duplicates" and "--duplicates" not in first
    _answer(slurm, "sacct", out="JobID|ElapsedRaw|AllocTRES\n6|95|cpu=2,gres/gpu=2,node=2\n")
    assert commands.sacct_usage(["6"]) == [
        {"JobID": "6", "ElapsedRaw": "95", "AllocTRES": "cpu=2,gres/gpu=2,node=2"}]
    assert slurm.calls("sacct")[-1][1:6] == ["--parsable2", "-X", "--duplicates", "-o",
                                              "JobID,ElapsedRaw,AllocTRES"]
    assert commands.sacct_usage([]) == []
    _answer(slurm, "sacct", err="sacct: error: Slurm accounting storage is disabled\n", rc=1)
    assert commands.sacct(["6"]) == [] and commands.sacct_usage(["6"]) == []
    # a sacct that failed after printing part of its answer: none of it is taken
    _answer(slurm, "sacct", out=(FIXTURES / "sacct_parsable2.txt").read_text(),
            err="sacct: error: slurmdbd: Getting response to message type: DBD_GET_JOBS_COND\n",
            rc=1)
    assert commands.sacct(["6"]) == [] and commands.sacct_usage(["6"]) == []


@pytest.mark.parametrize("srun_code,task_exits,want", [
    (1, [{"exit_code": 7}], 1),                     # srun's own code of a failure stands
    (0, [{"exit_code": 7}], 0),                     # and so does its success
    (128, [{"exit_code": 7}], 128),
    (143, [{"exit_code": None}, {"exit_code": 7}], 7),   # killed by srun: the first that exited
    (137, [{"exit_code": 0}, {"exit_code": 3}], 3),
    (143, [{"exit_code": None}], 143),              # nobody exited on their own
    (-15, [{"exit_code": 5}], 5),                   # a signal as Python reports it
])
def test_the_step_s_code_is_the_first_task_that_exited_on_its_own_after_srun_killed(
        srun_code, task_exits, want):
    assert commands.step_exit_code(srun_code, task_exits) == want


def test_what_acts_on_a_job_asks_slurm_exactly_this(slurm):
    commands.requeue("41")
    commands.exclude_nodes("41", ["n2", "n3"])
    commands.resize_pending_job("41", nodes=1)
    commands.resize_pending_job("41", nodes=2, tasks=4, cpus=8)
    commands.cancel([])                                       # nothing to cancel
    commands.cancel(["41_3", "41.1"], signal="USR1", full=True)
    commands.cancel(["41"])
    assert slurm.acted() == [
        ["scontrol", "requeue", "41"],
        ["scontrol", "update", "JobId=41", "ExcNodeList=n2,n3"],
        ["scontrol", "update", "JobId=41", "NumNodes=1"],           # tasks and CPUs left as is
        ["scontrol", "update", "JobId=41", "NumNodes=2", "NumTasks=4", "NumCPUs=8"],
        ["scancel", "--signal", "USR1", "--full", "41_3", "41.1"],
        ["scancel", "41"]]


@pytest.mark.parametrize("act", [
    lambda: commands.cancel(["--user=alice"]), lambda: commands.requeue("41 42"),
    lambda: commands.exclude_nodes("-1", ["n1"]), lambda: commands.resize_pending_job(
        "JobId=41", nodes=1), lambda: commands.cancel(["41", 41])])
def test_a_damaged_job_id_is_refused_before_slurm_is_asked(slurm, act):
    with pytest.raises(HpcTrainError, match="is not a Slurm job id"):
        act()
    assert slurm.calls() == []


def test_the_job_s_steps_and_nodes_leave_out_the_batch_step(slurm):
    assert commands.job_steps("41") == ["41.0", "41.1"]
    assert commands.job_step_nodes("41") == {"41.0": ["n1", "n2"], "41.1": ["n2"]}
    assert commands.parse_step_ids((FIXTURES / "squeue_steps.txt").read_text()) == ["192.0"]
    assert commands.node_address("n1") == "10.0.0.1"           # NodeAddr, not the name
    assert commands.job_info("41")["NodeList"] == "n[1-2]"
    # a job Slurm forgot: squeue refuses its id, and it has no steps, nodes or record left
    assert commands.job_steps("77") == [] and commands.job_step_nodes("77") == {}
    assert commands.job_info("77") == {}


@pytest.mark.parametrize("text,seconds", [
    ("45", 45 * 60),                    # minutes
    ("12:34", 12 * 60 + 34),            # minutes:seconds
    ("1:02:03", 3723),                  # hours:minutes:seconds
    ("1-02", 26 * 3600),                # days-hours
    ("1-02:03", 26 * 3600 + 3 * 60),    # days-hours:minutes
    ("2-00:00:01", 2 * 86400 + 1),      # days-hours:minutes:seconds
    ("0:00", 0),
])
def test_durations_in_every_form_of_slurm_s_grammar(text, seconds):
    assert commands.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "UNLIMITED", "N/A", "1:2:3:4", "1-", "-5", "1:-2", "1-2-3"])
def test_what_is_not_a_duration_is_none(text):
    assert commands.parse_duration(text) is None
