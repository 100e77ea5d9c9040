"""Shell completion (Click's, for bash, zsh and fish) of commands and of RUN arguments, and the
operations commands' fast start: none imports torch, submitit or matplotlib to look at a run."""

from __future__ import annotations

import pytest

from tests.cli.test_cli_basics import imported_heavy_modules
from tests.conftest import hpctrain
from tests.ops.helpers import crafted_run, record


@pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F _hpctrain_completion hpctrain"),
                                           ("zsh", "compdef _hpctrain_completion hpctrain"),
                                           ("fish", "complete --no-files --command hpctrain")])
def test_completion_scripts_for_each_shell(shell, marker):
    proc = hpctrain(env={"_HPCTRAIN_COMPLETE": f"{shell}_source"}, check=True)
    assert marker in proc.stdout


def test_commands_and_run_ids_complete(tmp_path):
    root = tmp_path / "runs"
    run = crafted_run(root)
    other = crafted_run(root)
    env = {"_HPCTRAIN_COMPLETE": "bash_complete", "HPCTRAIN_RUNS_DIR": str(root)}
    words = hpctrain(env={**env, "COMP_WORDS": "hpctrain re", "COMP_CWORD": "1"}, check=True)
    assert words.stdout.split() == ["plain,render", "plain,requeue", "plain,resume", "plain,report"]
    ids = hpctrain(env={**env, "COMP_WORDS": "hpctrain status tiny-", "COMP_CWORD": "2"}, check=True)
    assert sorted(ids.stdout.split()) == sorted([f"plain,{run.id}", f"plain,{other.id}"])
    one = hpctrain(env={**env, "COMP_WORDS": f"hpctrain logs {run.id}", "COMP_CWORD": "2"},
                   check=True)
    assert one.stdout.split() == [f"plain,{run.id}"]


def test_a_tab_with_a_bad_runs_folder_or_profile_path_completes_nothing_quietly(tmp_path):
    """Completion runs outside the commands' error door: a runs folder or profile path that is
    a FIFO completes nothing (exit 0, no traceback) instead of printing Python's stack."""
    import os
    os.mkfifo(tmp_path / "fifo")
    for env in ({"HPCTRAIN_RUNS_DIR": str(tmp_path / "fifo"),
                 "COMP_WORDS": "hpctrain status x", "COMP_CWORD": "2"},
                {"HPCTRAIN_PROFILE_PATH": str(tmp_path / "fifo"),
                 "COMP_WORDS": "hpctrain submit --profile l", "COMP_CWORD": "3"}):
        proc = hpctrain(env={"_HPCTRAIN_COMPLETE": "bash_complete", **env}, timeout=60)
        assert proc.returncode == 0 and proc.stdout.split() == [], (env, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_looking_at_runs_imports_no_heavy_module(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    run = crafted_run(root, ledger=[record(1, 0, 30, "finished", False)],
                      metrics=[{"step": 30, "loss": 2.5}])
    monkeypatch.setenv("HPCTRAIN_RUNS_DIR", str(root))
    for args in (["runs"], ["status", run.id], ["logs", "--help"], ["report", "--help"],
                 ["cancel", run.id], ["resume", "--help"]):
        assert imported_heavy_modules(*args) == [], args
