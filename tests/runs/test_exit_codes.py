"""The exit codes an attempt ends with, read back as the reasons the run's records give.

A job's exit code is what ``sacct`` shows, what the batch shell and submitit's local executor
decide on, and what users' scripts test: a rank exits with a code, a real process reports it
(negative for a signal when Python started it, 128 + the signal when a shell did), and
``reason_for`` must give back the reason the rank meant, whoever reported it. No Slurm, no
training: plain processes.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from click.testing import CliRunner

from hpctrain import exit_codes
from hpctrain.cli import cli
from hpctrain.errors import HpcTrainError, UsageError
from hpctrain.exit_codes import ExitReason, reason_for
from tests.conftest import REPO


def _rank_exits(code: int) -> int:
    """The exit code a real process that ends with ``exit(code)`` reports."""
    return subprocess.run(["sh", "-c", f"exit {int(code)}"], timeout=120).returncode


# a rank that dies of a signal (its default action, whatever the caller's shell ignores)
DIES_OF = """
import os, signal, sys
sig = int(sys.argv[1])
if sig != signal.SIGKILL:
    signal.signal(sig, signal.SIG_DFL)
os.kill(os.getpid(), sig)
"""


def _killed(sig: int, by_a_shell: bool) -> int:
    """The exit code of a process ended by ``sig``, as Python or as a shell reports it."""
    argv = [sys.executable, "-c", DIES_OF, str(int(sig))]
    if by_a_shell:
        argv = ["bash", "-c", '"$@"; exit $?', "bash", *argv]
    return subprocess.run(argv, timeout=120).returncode


def test_each_reason_a_rank_exits_with_is_read_back_from_its_process():
    # the ranks end on purpose with these codes; the batch shell and the ledger see only the
    # process's exit code, and must read the same reason from it
    meant = {exit_codes.FINISHED: ExitReason.FINISHED, exit_codes.UNSTABLE: ExitReason.UNSTABLE,
             exit_codes.PREFLIGHT_FAILED: ExitReason.PREFLIGHT_FAILED,
             exit_codes.HUNG: ExitReason.HUNG, exit_codes.PREEMPTED: ExitReason.PREEMPTED}
    read = {code: reason_for(_rank_exits(code)) for code in meant}
    assert read == meant
    assert len(set(meant)) == len(meant)     # no two reasons share a code


def test_a_rank_that_crashes_is_a_failure_and_so_is_a_step_refused_its_input():
    crash = subprocess.run([sys.executable, "-c", "raise RuntimeError('CUDA error')"],
                           capture_output=True, timeout=120).returncode
    assert reason_for(crash) == ExitReason.FAILED
    assert HpcTrainError("x").exit_code == crash     # hpctrain's own failures say the same
    # the preflight step given a folder that is no run folder exits with the usage code: the
    # attempt failed (it is no stability stop, no preflight verdict)
    usage = subprocess.run([sys.executable, "-m", "hpctrain.preflight.gate", str(REPO / "docs")],
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == UsageError("x").exit_code, usage.stderr
    assert reason_for(usage.returncode) == ExitReason.FAILED
    assert reason_for(None) == ExitReason.UNKNOWN     # no exit code at all (no process seen)


def test_the_cli_gives_one_code_for_bad_input_whoever_finds_it(tmp_path):
    runner = CliRunner()
    by_click = runner.invoke(cli, ["render", "--no-such-option"])
    missing = runner.invoke(cli, ["render", str(tmp_path / "missing.yaml")])
    assert by_click.exit_code == missing.exit_code == exit_codes.USAGE, missing.output
    assert exit_codes.USAGE not in (exit_codes.FAILED, exit_codes.FINISHED)


def test_a_rank_killed_by_a_signal_is_killed_however_the_signal_is_reported():
    for sig in (signal.SIGHUP, signal.SIGKILL, signal.SIGTERM):
        for by_a_shell in (False, True):
            code = _killed(sig, by_a_shell)
            assert code == (128 + sig if by_a_shell else -sig)
            assert reason_for(code) == ExitReason.KILLED, (sig, by_a_shell, code)
    # 128 itself is no signal (128 + 0): a step that exits with it failed
    assert reason_for(_rank_exits(128)) == ExitReason.FAILED


def test_submitit_s_local_restart_code_is_a_preemption():
    # under the local executor the ranks ask submitit for a restart with submitit's own code,
    # and an attempt that ended with it was preempted (it saved a checkpoint), not killed
    from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE
    assert exit_codes.LOCAL_REQUEUE == LOCAL_REQUEUE_RETURN_CODE
    assert reason_for(_rank_exits(LOCAL_REQUEUE_RETURN_CODE)) == ExitReason.PREEMPTED
    assert LOCAL_REQUEUE_RETURN_CODE in exit_codes.NOT_A_CRASH


def test_the_exit_code_table_in_the_docs_is_what_the_code_reads():
    # users' scripts and dashboards act on these numbers: each row of the table names the
    # reason the code gives for its number, and every reason a code can give has a row
    words = {ExitReason.FINISHED: "finished", ExitReason.PREEMPTED: "preempted",
             ExitReason.FAILED: "crash", ExitReason.UNSTABLE: "stability guard",
             ExitReason.PREFLIGHT_FAILED: "preflight", ExitReason.HUNG: "hung"}
    text = (REPO / "docs" / "checkpoints.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, re.M)
    assert len(rows) >= 7, rows
    for number, meaning in rows:
        why = reason_for(int(number))
        assert words[why] in meaning, (number, why, meaning)
    assert {reason_for(int(n)) for n, _ in rows} == set(exit_codes.REASONS.values())
