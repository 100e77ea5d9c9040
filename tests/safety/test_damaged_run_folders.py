"""Property: whatever a run folder's files hold (arbitrary bytes, JSON of any shape, a FIFO, a
socket, a folder, a link to /dev/zero or out of the folder), ``hpctrain runs``, ``status``,
``logs`` and ``hpctrain.runs()`` answer (exit 0, or one ``Error:`` line naming the
file, exit 1 or 2), never a traceback nor a hang; the other runs are still listed; and no file
of the run folders is changed.

The run folders are real ones (``hpctrain submit --dry-run`` on the local profile), copied for
each example; the files are then damaged the ways the run-folder reader must survive.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

import hpctrain
from hpctrain.cli import cli
from hpctrain.ops.runs_index import INDEX_FILE, read_index
from hpctrain.view.summary_cache import CACHE_FILE
from tests.conftest import unix_socket_at, REPO

TINY = str(REPO / "examples" / "tiny.yaml")
EXAMPLES = int(os.environ.get("HPCTRAIN_HYPOTHESIS_EXAMPLES", "30"))

TARGETS = ["run.yaml", "ledger.jsonl", "events.jsonl", "metrics.jsonl", "job.yaml",
           "logs/attempt-1/rank-0.log", "logs/attempt-1/batch.log",
           "logs/attempt-1/result.json", "logs/attempt-1/heartbeat/rank-0.json",
           "checkpoints/latest", "checkpoints/owner.json"]

_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(["attempt", "step", "loss", "event",
                                                         "kind", "jobs", "job_id", "end_step",
                                                         "exit_reason", "decision", "time",
                                                         "name", "scheduler", "files"]),
                                       inner, max_size=4), max_leaves=8)
_line = st.one_of(_json.map(lambda v: json.dumps(v).encode()), st.binary(max_size=40))
CONTENT = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=300)),
    st.tuples(st.just("lines"), st.lists(_line, max_size=4).map(lambda ls: b"\n".join(ls))),
    st.tuples(st.just("yaml"), st.sampled_from([b"jobs: 5\n", b"jobs:\n- kind: train\n",
                                                b"name: [1]\n", b"jobs: [\n", b"- 1\n",
                                                b"a: &a [*a]\n", b"{}\n"])),
    st.tuples(st.sampled_from(["fifo", "dev-zero", "link-out", "folder", "socket", "loop"]),
              st.just(b"")))


def _damage(run: Path, target: str, kind: str, data: bytes) -> None:
    path = run / target
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path):
        path.unlink()
    if kind in ("bytes", "lines", "yaml"):
        path.write_bytes(data)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "link-out":
        path.symlink_to(run.parent.parent / "outside.txt")
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        unix_socket_at(path)


def _snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            st_ = os.lstat(p)
            kind = st_.st_mode & 0o170000
            out[str(p)] = (kind, p.read_bytes() if os.path.isfile(p) and not p.is_symlink()
                           else os.readlink(p) if p.is_symlink() else None)
    return out


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """Two real run folders (dry runs of the tiny job on the local profile)."""
    root = tmp_path_factory.mktemp("template") / "runs"
    env = {"HPCTRAIN_RUNS_DIR": str(root)}
    for _ in range(2):
        result = CliRunner().invoke(cli, ["submit", TINY, "--dry-run"], env=env)
        assert result.exit_code == 0, result.output
    runs = sorted(p.name for p in root.iterdir())
    assert len(runs) == 2 and runs[0] != runs[1]
    return root, runs


class _Hang(Exception):
    pass


def _on_alarm(*_):
    raise _Hang("a command did not answer within 60 s")


def _answers(result, argv) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        (argv, result.output, result.exc_info)
    assert "internal error" not in result.output and "Traceback" not in result.output, \
        (argv, result.output)
    if result.exit_code != 0:
        assert result.exit_code in (1, 2), (argv, result.exit_code, result.output)
        errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, (argv, result.output)


@settings(max_examples=EXAMPLES)
@given(target=st.sampled_from(TARGETS), content=CONTENT,
       command=st.sampled_from(["status", "status-json", "logs", "logs-batch"]))
def test_a_damaged_run_folder_never_breaks_the_commands(template, tmp_path_factory, target,
                                                        content, command):
    src, (damaged_id, other_id) = template
    base = tmp_path_factory.mktemp("damaged")
    root = base / "runs"
    shutil.copytree(src, root, symlinks=True)
    (base / "outside.txt").write_text('{"attempt": 1}\n')
    kind, data = content
    _damage(root / damaged_id, target, kind, data)
    before = _snapshot(root)
    env = {"HPCTRAIN_RUNS_DIR": str(root)}
    argv = {"status": ["status", damaged_id], "status-json": ["status", damaged_id, "--json"],
            "logs": ["logs", damaged_id], "logs-batch": ["logs", damaged_id, "--batch"]}[command]
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(60)
    try:
        listing = CliRunner().invoke(cli, ["runs", "--json"], env=env)
        _answers(listing, ["runs", "--json"])
        rows = {row["run"]: row for row in json.loads(listing.output)}
        assert rows[other_id]["state"] == "NOT SUBMITTED", rows   # the other run lists normally
        assert damaged_id in rows                                 # the damaged one is shown
        row = rows[damaged_id]
        if row["state"] == "DAMAGED":
            assert row["damaged"]["why"] and row["detail"], row
        _answers(CliRunner().invoke(cli, ["runs"], env=env), ["runs"])
        _answers(CliRunner().invoke(cli, argv, env=env), argv)
        runs = hpctrain.runs(root)
        assert {r.id for r in runs} == {damaged_id, other_id}
        assert {r.summary()["state"] for r in runs if r.id == other_id} == {"NOT SUBMITTED"}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    after = _snapshot(root)
    assert {p: after.get(p) for p in before} == before            # nothing changed on disk
    added = set(after) - set(before)        # only the listing's kept rows, never a damaged run's
    assert {p for p in added if Path(p).name != CACHE_FILE} <= {str(root / INDEX_FILE)}, added
    if row["state"] == "DAMAGED":
        assert str(root / damaged_id / CACHE_FILE) not in added, added
        assert damaged_id not in read_index(root)[1]


@pytest.mark.parametrize("target, kind", [("metrics.jsonl", "fifo"), ("ledger.jsonl", "lines"),
                                          ("events.jsonl", "dev-zero")])
def test_report_of_a_damaged_run_is_one_error_line(template, tmp_path, target, kind):
    src, (damaged_id, _) = template
    root = tmp_path / "runs"
    shutil.copytree(src, root, symlinks=True)
    _damage(root / damaged_id, target, kind, b'{"attempt": "1"}\n')
    result = CliRunner().invoke(cli, ["report", damaged_id, "-o", str(tmp_path / "r.png")],
                                env={"HPCTRAIN_RUNS_DIR": str(root)})
    _answers(result, ["report"])
    assert result.exit_code == 2 and target in result.output, result.output
    assert not (tmp_path / "r.png").exists()
