"""What a new user runs into first, each as the user meets it: a closed pipe, a job `validate`
calls ok and `submit` refuses, a dry run off the cluster, a job name that names several runs,
dry-run folders piling up, a long ETA, `render`'s run folder, `logs --batch` without a batch
log, and completing `-p`."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from hpctrain.config import yamlio
from hpctrain.record.folder import RunFolder as Run
from tests.conftest import REPO
from tests.ops.helpers import cli, crafted_run

RUN_ID = r"[A-Za-z0-9_.+-]+-\d{8}-\d{6}-[0-9a-f]{4}"


def hpctrain_into_closed_pipe(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``hpctrain ARGS | head -0``: the reader is gone before the first line is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "hpctrain", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=300,
                              env={**os.environ, **(env or {})})
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [["plan", "examples/tiny.yaml"], ["profiles", "list"],
                                  ["render", "examples/tiny.yaml", "-p", "dev-slurm"],
                                  ["runs", "--json"]])
def test_a_closed_pipe_ends_quietly(args, tmp_path):
    proc = hpctrain_into_closed_pipe(*args, env={"HPCTRAIN_RUNS_DIR": str(tmp_path)})
    assert proc.stderr == ""                 # no "Error: internal error: BrokenPipeError"
    assert proc.returncode == 128 + 13       # as a Unix tool killed by SIGPIPE


@pytest.fixture
def small_vocab_job(tmp_path) -> str:
    """examples/tiny.yaml with a vocabulary smaller than its byte tokenizer's 257 ids."""
    data = yamlio.read_mapping(REPO / "examples" / "tiny.yaml")
    data["model"]["vocab_size"] = 200
    for corpus in data["data"]["blend"]:          # the example's corpora, by absolute path
        corpus["path"] = str(REPO / "examples" / corpus["path"])
        corpus["prepare_from"] = [str(REPO / "examples" / f) for f in corpus["prepare_from"]]
    path = tmp_path / "small-vocab.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return str(path)


def test_validate_refuses_what_submit_refuses(small_vocab_job, tmp_path):
    root = tmp_path / "runs"
    expected = "model.vocab_size: 200 is smaller than the tokenizer's vocabulary (257)"
    for args in (["validate", small_vocab_job], ["validate", small_vocab_job, "-p", "dev-slurm"],
                 ["submit", small_vocab_job, "-p", "dev-slurm", "--dry-run"]):
        res = cli(root, *args, check=False)
        assert res.returncode == 2 and expected in res.stderr, (args, res.stderr)
    assert not root.exists()                # nothing was created for the refused job
    fixed = cli(root, "validate", small_vocab_job, "--set", "model.vocab_size=257")
    assert fixed.stdout.startswith(f"{small_vocab_job}: ok on local")


def test_a_dry_run_off_the_cluster_writes_the_script_and_warns(tmp_path):
    """The data lives on the cluster's file system: here it is missing, and that is a warning
    for validate and a dry run, a refusal for a real submission."""
    data = yamlio.read_mapping(REPO / "examples" / "tiny.yaml")
    data["data"] = {"path": "/lustre/team/tokens/kjv_byte", "tokenizer": "byte",
                    "split": data["data"]["split"]}
    job = tmp_path / "on-cluster.yaml"
    yamlio.write_atomic(job, yamlio.dump(data))
    root = tmp_path / "runs"
    validated = cli(root, "validate", str(job), "-p", "dev-slurm")
    assert validated.returncode == 0 and "ok on dev-slurm" in validated.stdout
    assert "warning: data.path: /lustre/team/tokens/kjv_byte.bin does not exist" in validated.stderr
    dry = cli(root, "submit", str(job), "-p", "dev-slurm", "--dry-run")
    assert "warning: data.path: /lustre/team/tokens/kjv_byte.bin does not exist" in dry.stderr
    (run_dir,) = root.iterdir()
    run = Run(run_dir)
    assert run.meta()["dry_run"] is True and run.script_file.is_file()
    refused = cli(root, "submit", str(job), "-p", "local", check=False)
    assert refused.returncode == 2 and "data.path: /lustre/team/tokens/kjv_byte.bin" in refused.stderr
    assert list(root.iterdir()) == [run_dir]   # the refused submission created nothing


def test_a_job_name_is_its_newest_run_and_a_partial_id_lists_the_candidates(tmp_path):
    root = tmp_path / "runs"
    older, newer = crafted_run(root), crafted_run(root)
    older.update_meta(created="2026-01-01T10:00:00+00:00")
    newer.update_meta(created="2026-01-02T10:00:00+00:00")
    res = cli(root, "status", "tiny-ops", "--json")
    assert res.returncode == 0
    assert f"tiny-ops: the newest of 2 runs of that job, {newer.id}" in res.stderr
    assert f'"run": "{newer.id}"' in res.stdout
    common = os.path.commonprefix([older.id, newer.id])
    ambiguous = cli(root, "status", common, check=False)
    assert ambiguous.returncode == 2
    assert older.id in ambiguous.stderr and newer.id in ambiguous.stderr
    assert "give more of the name" in ambiguous.stderr


def test_runs_prune_removes_dry_run_folders_only(tmp_path):
    root = tmp_path / "runs"
    dry_a, dry_b, kept = crafted_run(root), crafted_run(root), crafted_run(root)
    for run in (dry_a, dry_b):
        run.update_meta(dry_run=True)
    kept.add_job_id("4242")                      # submitted once: never a dry-run folder
    listing = cli(root, "runs", "prune", "--dry-run").stdout.splitlines()
    assert sorted(listing) == sorted(f"would remove {r.path}" for r in (dry_a, dry_b))
    assert dry_a.path.exists() and dry_b.path.exists()
    removed = cli(root, "runs", "prune").stdout.splitlines()
    assert sorted(removed) == sorted(f"removed {r.path}" for r in (dry_a, dry_b))
    assert sorted(p.name for p in root.iterdir()) == [kept.id]
    assert cli(root, "runs", "prune").stdout.startswith("No dry-run folders under")


def test_runs_rm_needs_the_full_id_and_keeps_checkpoints_outside_the_run(tmp_path):
    root = tmp_path / "runs"
    run, other = crafted_run(root), crafted_run(root)
    outside = tmp_path / "ck" / run.id
    outside.mkdir(parents=True)
    run.update_meta(checkpoint_dir=str(outside))
    vague = cli(root, "runs", "rm", "tiny-ops", check=False)
    assert vague.returncode == 2 and "a job name or prefix is not enough" in vague.stderr
    assert run.path.exists() and other.path.exists()
    shown = cli(root, "runs", "rm", run.id, "--dry-run").stdout
    assert shown.strip() == f"would remove {run.path} (checkpoints kept in {outside})"
    assert run.path.exists()
    cli(root, "runs", "rm", run.id)
    assert not run.path.exists() and outside.exists() and other.path.exists()


def test_runs_rm_and_prune_delete_only_real_run_folders_hpctrain_made(tmp_path):
    """``runs rm`` deleted any folder holding a file called ``run.yaml`` (another tool's
    project folder), and through a link in the runs folder it deleted the link's target;
    ``prune`` renamed a linked dry run and then failed half way. A link, a folder whose
    ``run.yaml`` records no run id, and one whose ``run.yaml`` is not a regular file are each
    refused in one line, exit 2, before anything is removed; ``prune`` leaves them alone."""
    root = tmp_path / "runs"
    real = crafted_run(root)
    project = tmp_path / "project"
    project.mkdir()
    (project / "run.yaml").write_text("epochs: 3\n")
    (project / "notes.txt").write_text("kept")
    elsewhere = crafted_run(tmp_path / "other-runs")
    elsewhere.update_meta(dry_run=True)
    (root / "linked").symlink_to(elsewhere.path)
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "run.yaml").mkdir()
    for ref, said in ((str(project), "records no run_id: it is not a folder hpctrain made"),
                      ("linked", "is a symbolic link (to "),
                      (str(root / "linked"), "is a symbolic link (to "),
                      (str(odd), "holds a run.yaml that is not a regular file")):
        refused = cli(root, "runs", "rm", real.id, ref, check=False)
        assert refused.returncode == 2, (ref, refused)
        assert said in refused.stderr and "nothing was removed" in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
    assert (project / "notes.txt").read_text() == "kept" and real.path.exists()
    assert elsewhere.path.exists() and (root / "linked").is_symlink()
    real.update_meta(dry_run=True)
    pruned = cli(root, "runs", "prune").stdout.splitlines()
    assert pruned == [f"removed {real.path}"]
    assert sorted(p.name for p in root.iterdir()) == ["linked"]
    assert elsewhere.path.exists() and (root / "linked").is_symlink()


@pytest.mark.parametrize("created", ["0001-01-01T00:00:00", "0001-01-01T00:00:00+23:59",
                                     "9999-12-31T23:59:59-23:59", "9999-12-31T23:59:59"])
def test_a_run_created_at_the_edge_of_time_is_listed_with_the_others(tmp_path, created):
    """A ``created`` time that ``datetime`` reads but cannot move to local time or UTC (year 1
    or year 9999 with an offset) made ``hpctrain runs`` an internal error, listing no run,
    once the folder was renamed (a name without the time makes the listing read it)."""
    root = tmp_path / "runs"
    made, other = crafted_run(root), crafted_run(root)
    made.update_meta(created=created)
    odd = Run(made.path.rename(root / "my-run"))
    for args in (("runs",), ("runs", "--json")):
        listed = cli(root, *args)
        assert "my-run" in listed.stdout and other.id in listed.stdout, listed
    assert cli(root, "status", str(odd.path)).returncode == 0


@given(st.datetimes(min_value=__import__("datetime").datetime(1, 1, 1),
                    timezones=st.one_of(st.none(), st.timezones())) | st.text(max_size=40))
def test_a_recorded_time_is_read_whole_or_not_at_all(value):
    """Property: ``parse_iso``, the one reader of a recorded time, gives None or a time that
    moves to local time and UTC, whatever the text."""
    from hpctrain.config.durations import parse_iso
    t = parse_iso(value.isoformat() if hasattr(value, "isoformat") else value)
    if t is not None:
        assert t.tzinfo is not None
        t.astimezone(__import__("datetime").timezone.utc), t.astimezone()


def test_warning_and_error_lines_are_one_printable_line_whatever_home_holds(tmp_path):
    """``~`` in a path is ``$HOME``, which may hold an escape code or a line feed: the warning
    a dry run prints and the error a refusal prints show it escaped, each on one line (the
    CLI's two doors, ``warning_line`` and ``error_line``)."""
    from tests.conftest import hpctrain as run_cli
    home = tmp_path / "h\x1b]0;T\x07\nFAKE"
    home.mkdir()
    env = {"HOME": str(home), "HPCTRAIN_RUNS_DIR": str(tmp_path / "runs")}
    warned = run_cli("submit", "examples/tiny.yaml", "--dry-run", "--set",
                     "train.init_from=~/ck", env=env)
    assert warned.returncode == 0, warned.stderr
    (line,) = [ln for ln in warned.stderr.splitlines() if ln.startswith("warning:")]
    assert "\\x1b]0;T\\x07\\nFAKE/ck does not exist" in line, warned.stderr
    assert all(ln.isprintable() for ln in warned.stderr.splitlines()), warned.stderr
    assert not any(ln.startswith("FAKE") for ln in warned.stderr.splitlines())
    (home / "tok").write_text("not a tokenizer")
    refused = run_cli("validate", "examples/tiny.yaml", "--set", "data.tokenizer=~/tok",
                      env=env)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.rstrip("\n").isprintable(), refused.stderr


def test_a_runs_root_is_never_a_run_folder_and_rm_never_deletes_a_run_inside_another(tmp_path):
    """``--runs-dir RUN`` (or ``RUN/logs``) made runs inside another run's folder, and
    ``runs rm RUN`` then deleted them with it without a word. A runs root is refused there,
    whichever way it is given; a run folder holding another run is not removed."""
    import hpctrain as api
    from hpctrain.errors import UsageError
    root = tmp_path / "runs"
    outer = crafted_run(root)
    for inside in (outer.path, outer.path / "logs"):
        refused = cli(root, "submit", "examples/tiny.yaml", "-p", "dev-slurm", "--dry-run",
                      "--runs-dir", str(inside), check=False)
        assert refused.returncode == 2 and "a run folder; give the folder that holds run " \
            "folders" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
        with pytest.raises(UsageError, match="a run folder; give the folder"):
            api.submit("examples/tiny.yaml", profile="dev-slurm", dry_run=True, runs_dir=inside)
    assert sorted(p.name for p in outer.path.iterdir() if p.name.startswith("tiny")) == []
    nested = crafted_run(outer.path / "logs")             # made by hand, or by an older version
    refused = cli(root, "runs", "rm", outer.id, check=False)
    assert refused.returncode == 2 and "holds another run's folder" in refused.stderr
    assert outer.path.exists() and nested.path.exists()


def test_a_run_folder_renamed_to_hold_control_characters_is_printed_escaped_and_cut(tmp_path):
    """A run folder's name is whatever is on disk: one renamed to hold a terminal's title
    escape, a bell and a line feed, and long, is printed by ``runs``, ``status`` and ``runs rm``
    in one printable form (quoted, escapes shown, cut in the middle past 300 characters), one
    line each; ``runs rm`` still removes exactly that folder."""
    root = tmp_path / "runs"
    run, other = crafted_run(root), crafted_run(root)
    name = "x" * 225 + "\x1b]0;owned\x07\nFAKE" + "-tail"    # 245 bytes: NAME_MAX is 255
    hostile = run.path.with_name(name)
    os.rename(run.path, hostile)
    outputs = []
    listing = cli(root, "runs").stdout
    assert len(listing.splitlines()) == 3, listing      # the header and two rows
    assert any(ln.startswith(repr(name)[:40]) and "\\nFAKE-tail' " in ln
               for ln in listing.splitlines()), listing
    status = cli(root, "status", str(hostile)).stdout
    (folder,) = [ln for ln in status.splitlines() if ln.startswith("Folder")]
    assert len(folder) == len("Folder      ") + 300 and "..." in folder, folder
    assert folder.endswith("\\x07\\nFAKE-tail'"), folder
    shown = cli(root, "runs", "rm", str(hostile), "--dry-run").stdout
    assert shown.count("\n") == 1 and shown.startswith("would remove '") and "..." in shown, shown
    removed = cli(root, "runs", "rm", str(hostile)).stdout
    assert removed == shown.replace("would remove", "removed", 1)
    assert not hostile.exists() and other.path.exists()
    for out in (listing, status, shown, removed):
        assert not any(c in out for c in "\x1b\x07"), out
        assert not any(ln.startswith("FAKE") for ln in out.splitlines()), out


def test_an_eta_over_an_hour_uses_the_cli_duration_format():
    from hpctrain.runtime.metrics import MetricsWriter
    writer = object.__new__(MetricsWriter)     # progress_line reads total_steps only
    writer.total_steps = 1_000_010
    rec = {"step": 10, "loss": 2.5, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 1000.0,
           "step_time_s": 0.5, "mfu": None, "skipped": None}
    line = writer.progress_line(rec)
    assert line.endswith("ETA 5d18h")          # 500,000 s; not "8333m20s"
    assert writer.progress_line({**rec, "step_time_s": 0.001}).endswith("ETA 16m40s")


def test_render_names_the_run_folder_as_submit_does(tmp_path):
    root = tmp_path / "runs"
    script = cli(root, "render", "examples/tiny.yaml", "-p", "dev-slurm").stdout
    rendered = set(re.findall(re.escape(str(root)) + r"/([^/\s'\"]+)", script))
    assert len(rendered) == 1
    (name,) = rendered
    assert re.fullmatch(RUN_ID, name) and name.startswith("tiny-gpt-")
    assert not root.exists()                  # render writes nothing
    cli(root, "submit", "examples/tiny.yaml", "-p", "dev-slurm", "--dry-run")
    (created,) = (p.name for p in root.iterdir())
    assert re.fullmatch(RUN_ID, created) and created[:-21] == name[:-21] == "tiny-gpt"


def test_logs_batch_without_a_batch_log_does_not_suggest_batch(tmp_path):
    root = tmp_path / "runs"
    run = crafted_run(root)
    run.begin_attempt()
    run.rank_log(1, 0).parent.mkdir(parents=True, exist_ok=True)
    run.rank_log(1, 0).write_text("step 1\n")
    res = cli(root, "logs", run.id, "--batch", check=False)
    assert res.returncode == 2
    assert "no batch.log in attempt 1" in res.stderr and "drop --batch" in res.stderr
    assert "--rank or --batch" not in res.stderr
    assert cli(root, "logs", run.id).stdout == "step 1\n"


def test_profile_names_complete_after_p(tmp_path):
    from tests.conftest import hpctrain
    env = {"_HPCTRAIN_COMPLETE": "bash_complete", "HPCTRAIN_RUNS_DIR": str(tmp_path)}
    for words, cword in (("hpctrain submit job.yaml -p dev", "4"),
                         ("hpctrain plan job.yaml --profile dev", "4"),
                         ("hpctrain resume RUN -p dev", "4")):
        out = hpctrain(env={**env, "COMP_WORDS": words, "COMP_CWORD": cword}, check=True)
        assert out.stdout.split() == ["plain,dev-slurm"], words
    files = hpctrain(env={**env, "COMP_WORDS": "hpctrain validate job.yaml -p ./my", "COMP_CWORD": "4"},
                     check=True)
    assert files.stdout.split() == ["file,./my"]


@pytest.mark.parametrize("args, said", [
    (["render", "/tmp"], "Error: Invalid value for 'JOB': File '/tmp' is a directory."),
    (["status", "--run-dir", "a\nb", "x"], "Error: No such option '--run-dir'."),
    (["bogus"], "Error: No such command 'bogus'."),
    (["render"], "Error: Missing argument 'JOB'."),
    (["plan", str(REPO / "examples" / "tiny.yaml"), "--tp", "x"],
     "Error: Invalid value for '--tensor-model-parallel-size' / '--tp': 'x'"),
])
def test_clicks_usage_errors_are_one_line_naming_the_help(args, said):
    """Click's own checks (a missing argument, a bad option value) say it in one line and
    exit 2, like every other bad input."""
    from tests.conftest import hpctrain
    proc = hpctrain(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(said) and line.endswith("--help`)"), line
