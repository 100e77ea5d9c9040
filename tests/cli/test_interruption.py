"""Commands stopped half-way (Ctrl-C, SIGTERM) and commands racing each other on one runs
folder: what is left on disk is consistent, and the command says so in one line.

The signal is real: a process runs the CLI with one library function wrapped so that, at its
N-th call, the process sends the signal to itself (the moment a person's Ctrl-C or a
``kill``/``timeout`` could land), and the files are real."""

from __future__ import annotations

import contextlib
import json
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
    # Ctrl-C reaches the command, as at a terminal: a shell that starts the suite in the
    # background (`.ci/run &`) has SIGINT ignored, and that is inherited down to here
    signal.signal(signal.SIGINT, signal.default_int_handler)
    target, n, sig = sys.argv[1], int(sys.argv[2]), getattr(signal, sys.argv[3], None)
    module, attr = target.split(":")
    module = importlib.import_module(module)
    *owners, attr = attr.split(".")            # module:function or module:Class.method
    for owner in owners:
        module = getattr(module, owner)
    original = getattr(module, attr)
    calls = [0]
    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n and sig is None:     # another command runs to its end, then this call
            import subprocess
            subprocess.run(os.environ["HOOK_COMMAND"], shell=True, check=True)
        elif calls[0] == n and os.environ.get("HOOK_GROUP"):   # a terminal's Ctrl-C: the
            os.killpg(os.getpgid(0), sig)                        # whole process group
            time.sleep(5)
            sys.exit("the signal did not stop the command")
        elif calls[0] == n and os.environ.get("HOOK_CONTINUE"):   # the call goes on: the
            os.kill(os.getpid(), sig)                               # signal lands when it may
        elif calls[0] == n:
            os.kill(os.getpid(), sig)
            time.sleep(5)          # the handler raises here
            sys.exit("the signal did not stop the command")
        return original(*args, **kwargs)
    setattr(module, attr, wrapped)
    from hpctrain.cli import main
    main(sys.argv[4:])
""")


def sigint_as_at_a_terminal() -> None:
    """A child's SIGINT handled by default (Python then raises KeyboardInterrupt), as under a
    terminal: the suite may run under a shell that ignores it (started in the background), and
    an ignored signal stays ignored in every process started below."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signalled(target: str, n: int, sig: str, *args: str, root, command: str = "",
              group: bool = False, go_on: bool = False) -> subprocess.CompletedProcess:
    """``hpctrain ARGS`` in a process that, at the N-th call of ``target``, sends itself
    ``sig`` (``"SIGINT"``, ``"SIGTERM"``; ``group``: to its whole process group, in a session
    of its own, as a terminal's Ctrl-C reaches every process of a command), or with
    ``sig="RUN"`` runs the shell ``command`` to its end first. ``go_on``: the call is made
    after the signal is sent (where signals are held, it lands after the held part)."""
    return subprocess.run([sys.executable, "-c", _SIGNALLED, target, str(n), sig, *args],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          start_new_session=group,
                          env={**os.environ, "HPCTRAIN_RUNS_DIR": str(root),
                               "HOOK_COMMAND": command, "HOOK_GROUP": "1" if group else "",
                               "HOOK_CONTINUE": "1" if go_on else ""})


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


def dry_runs(root, count: int) -> list[str]:
    import hpctrain
    return sorted(hpctrain.submit(str(REPO / "examples" / "tiny.yaml"), dry_run=True,
                                  runs_dir=str(root)).id for _ in range(count))


def test_two_prunes_at_once_both_end_well(tmp_path):
    """Two `runs prune` at once: each folder is removed once, and the prune that finds it
    gone says so. Before, the slower one ended with `Error: RUN -> .removing-...: does not
    exist`, exit 2, half-way through its list."""
    root = tmp_path / "runs"
    runs = dry_runs(root, 3)
    other = f"{sys.executable} -m hpctrain runs prune > {tmp_path}/other.out 2>&1"
    proc = signalled("hpctrain.ops.cleanup:plan_removal", 1, "RUN", "runs", "prune", root=root,
                     command=other)
    assert (tmp_path / "other.out").read_text().splitlines() == [f"removed {root / r}"
                                                                for r in runs]
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines() == [f"{root / r}: already removed (by another command "
                                        "meanwhile)" for r in runs]
    assert set(os.listdir(root)) - {".runs-index.json"} == set()


def test_a_removal_stopped_half_way_is_finished_by_prune(tmp_path):
    """`runs rm` stopped while it deletes (Ctrl-C) leaves the folder it had renamed to
    `.removing-...`, no longer a run, with whatever it still held (checkpoints: gigabytes).
    Before, nothing ever removed it; now `runs prune` finishes it, and only it."""
    root = tmp_path / "runs"
    gone, kept = dry_runs(root, 2)
    (root / gone / "checkpoints" / "step-1").mkdir(parents=True)
    (root / gone / "checkpoints" / "step-1" / "shard").write_bytes(b"x" * 4096)
    hpctrain("submit", "examples/tiny.yaml", "--dry-run", root=root)   # a dry run to prune too
    proc = signalled("shutil:rmtree", 1, "SIGINT", "runs", "rm", gone, root=root)
    stopped(proc, "SIGINT")
    (left,) = [p for p in os.listdir(root) if p.startswith(".removing-")]
    listed = hpctrain("runs", "--json", root=root)
    assert gone not in listed.stdout and kept in listed.stdout
    proc = hpctrain("runs", "prune", "--dry-run", root=root)
    assert proc.stdout.splitlines()[0] == (f"would finish removing {root / left} (a removal "
                                           "stopped half-way)")
    assert (root / left).is_dir()
    proc = hpctrain("runs", "prune", root=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (f"finished removing {root / left} (a removal "
                                           "stopped half-way)")
    assert not os.path.lexists(root / left)
    assert is_run_folder(root / kept) is False   # a dry run too: pruned with the third
    assert [p for p in os.listdir(root) if not p.startswith(".")] == []


def test_only_a_removal_whose_process_is_gone_is_abandoned(tmp_path):
    """A removal under way (its process alive), one from another host, a link and a folder
    that is not a removal's are left alone."""
    from hpctrain.record.files import _host, abandoned_removals
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".removing-a-{dead.pid}@{_host()}").mkdir()
    (tmp_path / f".removing-b-{os.getpid()}@{_host()}").mkdir()
    (tmp_path / f".removing-c-{dead.pid}@elsewhere").mkdir()
    (tmp_path / f".removing-d-{dead.pid}@{_host()}").symlink_to(tmp_path)
    (tmp_path / "run-x").mkdir()
    assert abandoned_removals(tmp_path) == [tmp_path / f".removing-a-{dead.pid}@{_host()}"]


def test_a_folder_being_removed_is_not_listed(tmp_path):
    """While `runs rm` deletes a big run, its folder is `.removing-...` and still holds its
    run.yaml; `runs` (the full listing, through the runs index) listed it as a run of that
    name, which no command could then act on. Now neither listing shows it."""
    from hpctrain.record.files import _removing_name
    root = tmp_path / "runs"
    gone, kept = dry_runs(root, 2)
    os.rename(root / gone, root / _removing_name(gone))   # what `runs rm` does first
    for args in (["runs", "--json"], ["runs", "--json", "-n", "5"]):
        proc = hpctrain(*args, root=root)
        assert proc.returncode == 0, proc.stderr
        assert [row["run"] for row in json.loads(proc.stdout)] == [kept]


@contextlib.contextmanager
def followed_running_run(root):
    """A run whose job looks live (a stand-in for the local controller: what `status` and
    `logs -f` take for a running job), and a real `hpctrain logs -f` following it, once it has
    printed the first line: ``(run id, run, controller, follower)``."""
    from hpctrain.record.folder import RunFolder
    (rid,) = dry_runs(root, 1)
    run = RunFolder(root / rid)
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                                   "hpctrain.scheduler.local.controller", str(run.submitit_dir)])
    try:
        run.update_meta(dry_run=False)
        run.add_job_id(str(controller.pid))
        run.rank_log(run.begin_attempt(), 0).write_text("step 1\n")
        follower = subprocess.Popen([sys.executable, "-m", "hpctrain", "logs", "-f", rid],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    cwd=REPO, env={**os.environ, "HPCTRAIN_RUNS_DIR": str(root)},
                                    preexec_fn=sigint_as_at_a_terminal)
        try:
            assert follower.stdout.readline() == "step 1\n"
            yield rid, run, controller, follower
        finally:
            follower.kill()
            follower.wait()
    finally:
        controller.kill()
        controller.wait()


def test_logs_follow_says_when_its_run_folder_is_removed(tmp_path):
    """`logs -f` on a running run whose folder is removed meanwhile: before, it read "no job
    is running" from the records gone with the folder and ended with exit 0, as if the run
    had ended; now one line says the folder was removed, exit 1."""
    from hpctrain.record.files import remove_run_folder
    with followed_running_run(tmp_path / "runs") as (rid, run, controller, follower):
        remove_run_folder(run.path)
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 1, err
        assert err.splitlines() == [f"Error: run folder {run.path} was removed while it was "
                                    "being followed; stopped following (`hpctrain runs` lists "
                                    "the runs there are)"]


def test_data_prepare_with_workers_stops_on_ctrl_c_in_one_line(tmp_path):
    """Ctrl-C at a terminal reaches `data prepare --workers 2` and its tokenizer processes:
    before, each worker printed its KeyboardInterrupt traceback (and the pool's closing
    thread an EOFError one) around the command's `Interrupted.`; now one line, and no output
    file, temporary or not, is left."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n"
                              for i in range(20000)))
    out = tmp_path / "out" / "corpus"
    out.parent.mkdir()
    proc = signalled("hpctrain.data.prepare:_write", 3, "SIGINT", "data", "prepare",
                     str(corpus), "--output", str(out), "--workers", "2", root=tmp_path,
                     group=True)
    stopped(proc, "SIGINT")
    assert os.listdir(out.parent) == []


def test_data_prepared_again_and_stopped_before_its_record_is_not_trusted(tmp_path):
    """`data prepare` publishes .bin/.idx, then PREFIX.meta.json. Stopped between the two
    (Ctrl-C), the prefix held the new corpus beside the previous one's record, and a job
    preparing from the previous files took the new data for theirs without a word. Now the
    record's counts are checked against the files: one line, exit 2, naming the fix."""
    from hpctrain.config import yamlio
    from tests.conftest import one_error_line
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("".join(f"first corpus, paragraph {i}: {'words ' * 30}\n\n"
                             for i in range(3000)))
    second.write_text("".join(f"second, {i}: {'other words ' * 20}\n\n" for i in range(3000)))
    prefix = tmp_path / "data" / "corpus"
    prefix.parent.mkdir()
    done = hpctrain("data", "prepare", str(first), "--output", str(prefix), root=tmp_path)
    assert done.returncode == 0, done.stderr
    job = yamlio.read_mapping(REPO / "examples" / "tiny.yaml")
    job["data"] = {"path": str(prefix), "prepare_from": [str(first)], "split": "969,30,1",
                   "tokenizer": "byte"}
    job_file = tmp_path / "job.yaml"
    yamlio.write_atomic(job_file, yamlio.dump(job))
    assert hpctrain("validate", str(job_file), root=tmp_path).returncode == 0
    proc = signalled("hpctrain.outputs:write_atomic", 1, "SIGINT", "data", "prepare",
                     str(second), "--output", str(prefix), root=tmp_path)
    stopped(proc, "SIGINT")
    one_error_line(hpctrain("validate", str(job_file), root=tmp_path),
                   f"data.path: {prefix}.meta.json does not describe {prefix}.bin/.idx",
                   "a `data prepare` stopped between its files",
                   f"remove {prefix}.bin/.idx/.meta.json to prepare it again")


@pytest.mark.parametrize("args", [["report", "{run}"], ["runs"], ["status", "{run}"]])
def test_a_run_removed_while_a_command_reads_it_is_not_made_again(tmp_path, args):
    """`runs rm` while `report`, `runs` or `status` reads the run: before, the write door
    made the removed folder again for what they write there (report.png, the listing's kept
    row), a folder holding one file that was no run, listed by nothing and refused by
    `runs rm`. Now nothing is written: `report` says the folder does not exist (exit 2), the
    listing and `status` answer from what they read."""
    root = tmp_path / "runs"
    (rid,) = dry_runs(root, 1)
    remove = f"{sys.executable} -m hpctrain runs rm {rid} > /dev/null"
    proc = signalled("hpctrain.record.folder:RunFolder.ledger", 1, "RUN",
                     *[a.format(run=rid) for a in args], root=root, command=remove)
    if args[0] == "report":
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines() == [f"Error: {root / rid}: does not exist"]
    else:
        assert proc.returncode == 0, proc.stderr
    assert set(os.listdir(root)) - {".runs-index.json"} == set()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_on_a_follow_says_the_run_goes_on(tmp_path, sig):
    """Ctrl-C on `logs -f` (or on `submit`'s follow of a local run) stops the following, not
    the run: before, the line was a bare `Interrupted.`, which reads as if training stopped;
    now it says the run goes on and how to follow or stop it. The run's job is untouched."""
    import time
    from hpctrain.scheduler.state import live_jobs
    with followed_running_run(tmp_path / "runs") as (rid, run, controller, follower):
        time.sleep(0.5)
        follower.send_signal(getattr(signal, sig))
        out, err = follower.communicate(timeout=60)
        word, code = ("Interrupted", 130) if sig == "SIGINT" else ("Terminated", 143)
        assert follower.returncode == code, err
        assert err.splitlines() == [f"{word}: stopped following; run {rid} goes on (`hpctrain "
                                    f"logs {rid} -f` follows it again, `hpctrain cancel {rid}` "
                                    "stops it)"]
        assert controller.poll() is None and live_jobs(run)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_resume_stopped_while_it_rewrites_the_job_changes_all_of_it_or_nothing(tmp_path, sig):
    """`resume --steps` keeps the job as job.N.yaml, writes the new job.yaml, and records it
    in run.yaml. Stopped between the last two, the run's job said 120 steps while run.yaml
    said 60 and kept no history of the change. Now the signal lands after the three: the
    record is whole, and nothing is submitted."""
    from hpctrain.config import yamlio
    from hpctrain.record.folder import RunFolder
    root = tmp_path / "runs"
    (rid,) = dry_runs(root, 1)
    run = RunFolder(root / rid)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run.update_meta(dry_run=False)
    run.add_job_id(str(dead.pid))          # a local job that ended
    # write_atomic's calls: job.1.yaml, job.yaml, run.yaml
    proc = signalled("hpctrain.config.yamlio:write_atomic", 3, sig, "resume", rid, "--steps",
                     "120", root=root, go_on=True)
    stopped(proc, sig)
    meta = run.meta()
    assert yamlio.read_mapping(run.job_file)["train"]["steps"] == 120
    assert meta["total_steps"] == 120
    assert [h["file"] for h in meta["job_history"]] == ["job.1.yaml"]
    assert run.job_ids() == [str(dead.pid)]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_job_queued_as_the_command_is_stopped_is_recorded_in_its_run(tmp_path, sig, sweep):
    """Stopped after sbatch queued the job and before its id reached run.yaml, the run showed
    NOT SUBMITTED while its job ran, and was removed as a run that never reached the scheduler
    (`runs rm` would have deleted it under the job too). The signal now lands once the id is
    recorded: the run keeps its job, and the command still stops in one line."""
    import stat as stat_modes
    from hpctrain.record.folder import RunFolder, iter_runs
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"             # Slurm's words when it queues a job
    sbatch.write_text("#!/bin/bash\necho 'Submitted batch job 4242'\n")
    sbatch.chmod(sbatch.stat().st_mode | stat_modes.S_IXUSR)
    root = tmp_path / "runs"
    extra = ["--sweep", "train.lr=1e-3,2e-3"] if sweep else []
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNALLED, "hpctrain.record.folder:RunFolder.add_job_id", "1",
         sig, "submit", "examples/tiny.yaml", "-p", "dev-slurm", "--force", *extra],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "HPCTRAIN_RUNS_DIR": str(root), "HOOK_COMMAND": "",
             "HOOK_GROUP": "", "HOOK_CONTINUE": "1",
             "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    stopped(proc, sig)
    runs = list(iter_runs(root))
    assert len(runs) == (2 if sweep else 1)
    ids = sorted(RunFolder(r.path).job_ids() for r in runs)
    assert ids == ([["4242_0"], ["4242_1"]] if sweep else [["4242"]]), ids
    assert all(any(e["event"] == "submitted" for e in r.events()) for r in runs)


def test_a_held_signal_lands_at_the_end_and_a_second_one_at_once():
    """``signals_held``: the first Ctrl-C waits for the block's end; a second is not held
    (the user insists); a process started inside starts with neither blocked nor ignored."""
    from hpctrain.record.files import signals_held
    done = []
    # as at a terminal (a suite started in the background runs with SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _held_signals_land(signals_held, done)
    finally:
        signal.signal(signal.SIGINT, before)
    with signals_held():
        child = subprocess.run(
            [sys.executable, "-c", "import signal; print(sorted(signal.pthread_sigmask("
             "signal.SIG_BLOCK, [])), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)"],
            capture_output=True, text=True, check=True)
    assert child.stdout.split() == ["[]", "True"]


def _held_signals_land(signals_held, done: list) -> None:
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            signal.raise_signal(signal.SIGINT)
            done.append("after the first")
    assert done == ["after the first"]
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            done.append("after the second")
    assert done == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# python -c: the console script's start, with SIGNAL sent to this process as `click` is imported
# (while the command line is still being imported); argv[2]: "ignored" to start with the
# signal ignored, as a shell's background job does
_EARLY = textwrap.dedent("""
    import importlib.abc, os, signal, sys
    sig = getattr(signal, sys.argv[1])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.argv[2] == "ignored":
        signal.signal(sig, signal.SIG_IGN)
    class Trip(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "click":
                os.kill(os.getpid(), sig)
            return None
    sys.meta_path.insert(0, Trip())
    from hpctrain.cli_start import main
    main(["--version"])
""")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_command_line_is_imported_is_one_line(sig):
    """Before, a Ctrl-C in the command's first tens of milliseconds (importing click and the
    CLI) printed an import traceback; SIGTERM ended it with no word. Now both end as later."""
    proc = subprocess.run([sys.executable, "-c", _EARLY, sig, "default"], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    stopped(proc, sig)
    assert proc.stdout == ""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_the_caller_ignores_stays_ignored_while_the_command_starts(sig):
    proc = subprocess.run([sys.executable, "-c", _EARLY, sig, "ignored"], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and "hpctrain, version" in proc.stdout, proc.stderr


def test_the_console_script_and_python_m_start_through_the_early_door():
    """``hpctrain`` (setup.cfg's console script) and ``python -m hpctrain`` both start in
    ``hpctrain.cli_start``, whose handlers are gone once the CLI has been imported."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert "hpctrain = hpctrain.cli_start:main" in cfg["options.entry_points"]["console_scripts"]
    assert (REPO / "hpctrain" / "__main__.py").read_text().startswith(
        "from .cli_start import main")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import signal
        from hpctrain import cli_start
        try:
            cli_start.main(["--version"])
        except SystemExit:
            pass
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,
              signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    """)], capture_output=True, text=True, cwd=REPO, timeout=120,
        preexec_fn=sigint_as_at_a_terminal)
    assert proc.stdout.split()[-2:] == ["True", "True"], (proc.stdout, proc.stderr)
