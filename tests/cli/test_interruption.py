"""Commands stopped half-way (Ctrl-C, SIGTERM) and commands racing each other on one runs
folder: what is left on disk is consistent, and the command says so in one line.

The signal is real: a process runs the CLI with one library function wrapped so that, at its
N-th call, the process sends the signal to itself (the moment a person's Ctrl-C or a
``kill``/``timeout`` could land), and the files are real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from hpctrain.record.files import is_run_folder
from tests.conftest import REPO

# python -c: run `hpctrain ARGS` with MODULE.ATTR sending SIGNAL to this process at call N
_SIGNALLED = textwrap.dedent("""
    import importlib, os, signal, sys, time
    target, n, sig = sys.argv[1], int(sys.argv[2]), getattr(signal, sys.argv[3])
    module, attr = target.split(":")
    module = importlib.import_module(module)
    original = getattr(module, attr)
    calls = [0]
    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), sig)
            time.sleep(5)          # the handler raises here
            sys.exit("the signal did not stop the command")
        return original(*args, **kwargs)
    setattr(module, attr, wrapped)
    from hpctrain.cli import main
    main(sys.argv[4:])
""")


def signalled(target: str, n: int, sig: str, *args: str, root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _SIGNALLED, target, str(n), sig, *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "HPCTRAIN_RUNS_DIR": str(root)})


def hpctrain(*args: str, root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "HPCTRAIN_RUNS_DIR": str(root)})


def stopped(proc, sig: str) -> None:
    """Ended as a stopped command must: one line, no traceback, 128 + the signal."""
    code, line = {"SIGINT": (130, "Interrupted."), "SIGTERM": (143, "Terminated.")}[sig]
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert proc.stderr.splitlines() == [line], proc.stderr


# write_atomic's calls in a dry run: job.yaml, profile.yaml, run.yaml, run.yaml (dry_run: true)
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("call", [1, 2, 3, 4])
def test_a_submission_stopped_half_way_leaves_no_half_run(tmp_path, sig, call):
    """Before, a Ctrl-C between the run folder's creation and its run.yaml left a folder that
    `runs` did not list and neither `runs rm` nor `runs prune` could remove; SIGTERM (Python's
    default: the process ends at once) left it at any moment. Now the folder is removed, and
    the runs already there are untouched."""
    root = tmp_path / "runs"
    before = hpctrain("submit", "examples/tiny.yaml", "--dry-run", root=root)
    assert before.returncode == 0, before.stderr
    (kept,) = os.listdir(root)
    proc = signalled("hpctrain.config.yamlio:write_atomic", call, sig,
                     "submit", "examples/tiny.yaml", "--dry-run", root=root)
    stopped(proc, sig)
    assert set(os.listdir(root)) - {".runs-index.json"} == {kept}
    assert is_run_folder(root / kept)


@pytest.mark.parametrize("call", [2, 5, 7])
def test_a_sweep_stopped_half_way_leaves_no_half_sweep(tmp_path, call):
    """A dry-run sweep of two runs interrupted while its run folders are written: neither
    the runs prepared so far nor the sweep's folder are left."""
    root = tmp_path / "runs"
    proc = signalled("hpctrain.config.yamlio:write_atomic", call, "SIGINT",
                     "submit", "examples/tiny.yaml", "--dry-run", "--sweep",
                     "train.lr=1e-3,2e-3", root=root)
    stopped(proc, "SIGINT")
    assert [p for p in os.listdir(root) if p != "sweeps"] == []
    assert os.listdir(root / "sweeps") == []


def test_sigterm_keeps_its_handler_out_of_the_caller():
    """The CLI's SIGTERM handler lives while a command runs: a program calling ``main`` gets
    its own handler back."""
    from hpctrain.cli import main
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(SystemExit):
        main(["profiles", "list"])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
