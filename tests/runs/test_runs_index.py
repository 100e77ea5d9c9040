"""The runs index (``RUNS_ROOT/.runs-index.json``): the full listing it gives is the listing the
run folders give, after runs are added, finish, change, are damaged or removed; while a writer
changes runs and other listings rewrite the index; and whatever damage the index suffers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from hpctrain.cli import cli
from hpctrain.ops.cleanup import remove_run_folder
from hpctrain.ops.listing import newest_runs
from hpctrain.record.folder import RunFolder
from hpctrain.scheduler.local.jobs import CONTROLLER_MODULE
from hpctrain.view import summary_cache
from hpctrain.ops.runs_index import FORMAT, INDEX_FILE, listing_rows, read_index
from hpctrain.view.runview import add_usage, build_views
from hpctrain.view.summary_cache import CACHE_FILE
from tests.conftest import unix_socket_at
from tests.runs.test_summary_cache import _bench_runs

EXAMPLES = int(os.environ.get("HPCTRAIN_HYPOTHESIS_EXAMPLES", "30"))


def _truth(root: Path) -> list[dict]:
    """The listing built from the run folders alone: no kept row, no index."""
    return [v.summary() for v in add_usage(build_views(newest_runs(root)))]


def _listing(root: Path) -> tuple[list[dict], list[str]]:
    warnings: list[str] = []
    return listing_rows(root, warn=warnings.append), warnings


def _indexed(root: Path) -> set[str]:
    """The runs the index of ``root`` names (it must be readable)."""
    _, entries, problem = read_index(root)
    assert problem is None, problem
    return set(entries)


def _body(root: Path) -> dict:
    return json.loads((root / INDEX_FILE).read_bytes().partition(b"\n")[2])


def _write_body(root: Path, body) -> None:
    """An index holding ``body`` under a valid header: damage the checksum cannot see."""
    data = json.dumps(body).encode()
    (root / INDEX_FILE).write_bytes(b"hpctrain-runs-index %d %08x %d\n"
                                    % (FORMAT, zlib.crc32(data), len(data)) + data)


def _kept_names(rows: list[dict]) -> set[str]:
    return {r["run"] for r in rows if r["state"] in summary_cache.SETTLED and "damaged" not in r}


def _copy_run(root: Path, source: str, stamp: str) -> RunFolder:
    """A new run: a copy of ``source`` under a new run id (its own inodes and times).

    The copy leaves out the summary cache and its temporary files: listings running beside
    the copy rewrite the source's cache (write a temporary file, rename it), and a temporary
    file that is renamed between copytree's listing and its copy would fail the copy."""
    new = RunFolder(root / f"tiny-ops-{stamp}-beef")
    shutil.copytree(root / source, new.path,
                    ignore=shutil.ignore_patterns(CACHE_FILE, f".{CACHE_FILE}.*.tmp"))
    new.update_meta(run_id=new.id)
    return new


@pytest.fixture
def root(tmp_path) -> Path:
    """Five finished local runs built as `tools/bench_runs` builds them."""
    root = tmp_path / "runs"
    root.mkdir()
    _bench_runs().build(root, 5)
    shutil.rmtree(root / ".template", ignore_errors=True)      # what the builder leaves
    return root


def test_the_index_lists_what_the_run_folders_say_as_runs_come_change_and_go(root):
    rows, warnings = _listing(root)
    assert rows == _truth(root) and not warnings
    assert _indexed(root) == _kept_names(rows) and len(rows) == 5
    ids = [r["run"] for r in rows]

    added = _copy_run(root, ids[0], "20300101-000000")               # a run added
    run = RunFolder(root / ids[1])                                   # a run that trains on
    with run.metrics_file.open("a") as f:
        f.write(json.dumps({"step": 61, "loss": 0.25}) + "\n")
    damaged = RunFolder(root / ids[2])                               # a run damaged
    ledger = damaged.ledger_file.read_bytes()
    damaged.ledger_file.write_text('{"attempt": "one"}\n')
    shutil.rmtree(root / ids[3])                                     # a run removed
    rows, warnings = _listing(root)
    assert rows == _truth(root) and not warnings
    by_id = {r["run"]: r for r in rows}
    assert rows[0]["run"] == added.id and ids[3] not in by_id
    assert (by_id[run.id]["step"], by_id[run.id]["loss"]) == (61, 0.25)
    assert by_id[damaged.id]["state"] == "DAMAGED"
    assert _indexed(root) == _kept_names(rows) and damaged.id not in _indexed(root)

    # a run whose job is live (the process the local backend looks for) is never taken from
    # the index; once the job is gone its ended state shows, though no file changed
    live = RunFolder(root / ids[4])
    live.path.joinpath("submitit").mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             CONTROLLER_MODULE, str(live.submitit_dir)])
    try:
        live.update_meta(jobs=[{"job_id": str(proc.pid), "kind": "train"}])
        for _ in range(2):
            rows, _ = _listing(root)
            assert {r["run"]: r["state"] for r in rows}[live.id] == "RUNNING"
            assert live.id not in _indexed(root)
    finally:
        proc.kill()
        proc.wait()
    rows, _ = _listing(root)
    assert {r["run"]: r["state"] for r in rows}[live.id] == "FINISHED"
    assert rows == _truth(root) and _indexed(root) == _kept_names(rows)

    damaged.ledger_file.write_bytes(ledger)                          # repaired
    rows, _ = _listing(root)
    assert rows == _truth(root) and damaged.id in _indexed(root)


def test_a_warm_listing_takes_every_row_from_the_index(root, monkeypatch):
    """With each run's own kept row gone, the rows still come from the index alone: no run is
    built (build_views is called for none)."""
    expected, _ = _listing(root)
    for run in root.iterdir():
        if (run / "run.yaml").exists():
            (run / CACHE_FILE).unlink()
    built: list = []
    real = summary_cache.build_views
    monkeypatch.setattr(summary_cache, "build_views", lambda runs: built.extend(runs) or real(runs))
    assert _listing(root) == (expected, [])
    assert built == []
    assert not any((run / CACHE_FILE).exists() for run in root.iterdir())
    assert oct(os.stat(root / INDEX_FILE).st_mode & 0o777) == oct(0o600)


def test_an_index_from_elsewhere_never_stands_for_this_folders_runs(root, tmp_path):
    """A valid index naming other folders (another runs folder's, paths out of this one) or
    this folder's runs with other files' fingerprints: the rows are built from the runs here."""
    other = tmp_path / "other"
    other.mkdir()
    _bench_runs().build(other, 5)                      # the same run ids, other files
    shutil.rmtree(other / ".template", ignore_errors=True)
    _listing(other)
    body = _body(other)
    assert set(body["runs"]) == {p.name for p in root.iterdir() if p.is_dir()}
    loss = body["columns"].index("loss")
    for entry in body["runs"].values():
        entry[1][loss] = 99.0
    body["runs"].update({f"../other/{k}": v for k, v in body["runs"].items()})
    _write_body(root, body)
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    rows, warnings = _listing(root)
    assert rows == _truth(root) and not warnings
    assert all(r["loss"] != 99.0 for r in rows)
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before


def test_listings_stay_true_while_a_writer_changes_the_runs(root):
    """One thread trains runs on (metrics appended), starts and removes runs, while two others
    list over and over (each rewriting the index). Every listing shows every step written
    before it began (never a stale row), no run removed before it began, every run created
    before it began; no listing sees a torn index; the last listing is the folders' truth."""
    ids = sorted(p.name for p in root.iterdir())
    lock = threading.Lock()
    done = {i: 60 for i in ids}          # step whose write has completed
    started = dict(done)                 # step whose write has begun
    created: set[str] = set(ids)
    removed: set[str] = set()
    in_flux: set[str] = set()            # runs being removed (never taken out again)
    stop = threading.Event()
    failures: list = []

    def writer():
        try:
            for k in range(30):
                run = ids[k % 3]
                with lock:
                    started[run] += 1
                    step = started[run]
                with (root / run / "metrics.jsonl").open("a") as f:
                    f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\n")
                with lock:
                    done[run] = step
                if k % 10 == 4:
                    _copy_run(root, ids[4], f"2030010{k // 10}-000000")
                    with lock:
                        created.add(f"tiny-ops-2030010{k // 10}-000000-beef")
                if k == 15:
                    with lock:
                        in_flux.add(ids[3])         # from here on, it may be listed or not
                    remove_run_folder(root / ids[3])     # as `hpctrain runs rm` does
                    with lock:
                        removed.add(ids[3])
                time.sleep(0.01)
        except BaseException as e:
            failures.append(e)
        finally:
            stop.set()

    def reader():
        try:
            while True:
                finishing = stop.is_set()
                with lock:
                    before = (dict(done), set(created), set(removed))
                rows, warnings = _listing(root)
                with lock:
                    after_started, flux = dict(started), set(in_flux)
                assert not warnings, warnings
                by_id = {r["run"]: r for r in rows}
                done_before, created_before, removed_before = before
                assert created_before - flux <= set(by_id), (created_before, flux, set(by_id))
                assert not removed_before & set(by_id)
                for run, step in done_before.items():
                    if run not in removed_before and run not in flux:
                        assert step <= by_id[run]["step"] <= after_started[run], \
                            (run, step, by_id[run]["step"], after_started[run])
                if finishing:
                    return
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, "".join(__import__("traceback").format_exception(failures[0]))[-1500:]
    rows, warnings = _listing(root)
    assert rows == _truth(root) and not warnings
    assert _indexed(root) == _kept_names(rows)
    assert {r["step"] for r in rows if r["run"] in ids[:3]} == {70}


# ---- damage ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("index-template") / "runs"
    root.mkdir()
    _bench_runs().build(root, 4)
    shutil.rmtree(root / ".template", ignore_errors=True)
    bad = sorted(root.iterdir())[1]
    (bad / "events.jsonl").write_text('{"event": 5}\n')               # one DAMAGED run
    return root


def _entry_damage(body: dict, how: str) -> dict:
    """``body`` (the index's JSON) with one entry, or its shape, wrong."""
    runs = body["runs"]
    key = sorted(runs)[0]
    if how == "fingerprint":
        runs[key][0] = [[1, 2, 3]] * 6
    elif how == "row-not-list":
        runs[key][1] = "row"
    elif how == "state":
        runs[key][1][body["columns"].index("state")] = "RUNNING"
    elif how == "short-row":
        runs[key][1] = runs[key][1][:-1]
    elif how == "entry-shape":
        runs[key] = {"fingerprint": runs[key][0]}
    elif how == "extra":
        runs["tiny-ops-x"] = [[None] * 6, {"state": "FINISHED"}]
    elif how == "columns":
        body["columns"] = "state"
    elif how == "not-an-object":
        return [body]                                                # type: ignore[return-value]
    return body


DAMAGE = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=200), st.just(0.0)),
    st.tuples(st.sampled_from(["cut", "flip", "insert"]), st.binary(min_size=1, max_size=8),
              st.floats(0, 1)),
    st.tuples(st.just("entries"), st.sampled_from(["fingerprint", "row-not-list", "state",
                                                   "short-row", "entry-shape", "extra", "columns",
                                                   "not-an-object"]).map(str.encode),
              st.just(0.0)),
    st.tuples(st.sampled_from(["missing", "empty", "fifo", "folder", "socket", "dev-zero",
                               "link-other", "other-format"]), st.just(b""), st.just(0.0)))


def _damage(root: Path, kind: str, data: bytes, where: float) -> None:
    path = root / INDEX_FILE
    good = path.read_bytes()
    at = int(where * len(good))
    if kind != "link-other":
        path.unlink()
    if kind == "bytes":
        path.write_bytes(data)
    elif kind == "cut":
        path.write_bytes(good[:at])
    elif kind == "flip":
        at = min(at, len(good) - 1)
        path.write_bytes(good[:at] + bytes([good[at] ^ (data[0] or 1)]) + good[at + 1:])
    elif kind == "insert":
        path.write_bytes(good[:at] + data + good[at:])
    elif kind == "entries":
        _write_body(root, _entry_damage(json.loads(good.partition(b"\n")[2]), data.decode()))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        unix_socket_at(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "link-other":
        other = root.parent / "other-index"
        other.write_bytes(good)
        path.unlink()
        path.symlink_to(other)
    elif kind == "other-format":
        path.write_bytes(good.replace(b"hpctrain-runs-index %d " % FORMAT,
                                    b"hpctrain-runs-index %d " % (FORMAT - 1), 1))


def _run_files(root: Path) -> dict:
    return {str(p): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.is_symlink() and p.parent != root}


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=DAMAGE)
def test_a_damaged_index_never_changes_what_is_listed(template, tmp_path_factory, damage):
    """Whatever happens to the index file (any bytes, cut, a flipped or inserted byte, entries
    of the wrong shape under a valid checksum, a FIFO, folder, socket or link in its place),
    the listing is the run folders' listing, with at most one warning line; no run folder's
    file is changed; and the index is rewritten where it can be, so the next listing is quiet."""
    root = tmp_path_factory.mktemp("damaged-index") / "runs"
    shutil.copytree(template, root, symlinks=True)
    expected, _ = _listing(root)
    assert expected == _truth(root) and len(expected) == 4
    kind, data, where = damage
    _damage(root, kind, data, where)
    before = _run_files(root)
    rows, warnings = _listing(root)
    assert rows == expected
    assert len(warnings) <= 1 and all(w.startswith("Warning: the runs index ") for w in warnings)
    if kind in ("missing", "other-format"):
        assert not warnings
    if kind == "link-other":                  # the link is replaced, never what it points to
        assert (root.parent / "other-index").read_bytes().startswith(b"hpctrain-runs-index")
    after = _run_files(root)
    assert {p: after.get(p) for p in before if not p.endswith(CACHE_FILE)} == \
        {p: v for p, v in before.items() if not p.endswith(CACHE_FILE)}
    again, warnings = _listing(root)
    assert again == expected
    if kind not in ("folder",):
        assert not warnings and _indexed(root) == _kept_names(expected)


def test_runs_says_in_one_line_that_it_rebuilt_a_damaged_index(root):
    CliRunner().invoke(cli, ["runs"], env={"HPCTRAIN_RUNS_DIR": str(root)})
    (root / INDEX_FILE).write_bytes(b"\x00garbage")
    result = CliRunner().invoke(cli, ["runs", "--json"],
                                                env={"HPCTRAIN_RUNS_DIR": str(root)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == _truth(root)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"Warning: the runs index {root / INDEX_FILE} "), result.stderr


def test_the_python_api_ranks_a_runs_folder_in_one_call_from_the_index(root):
    """``hpctrain.runs_table()`` is ``runs --json``: the same rows through the same index, a
    damaged index a warning, bad arguments the API's usage errors."""
    import warnings

    import hpctrain
    from hpctrain.errors import UsageError
    cli_rows = json.loads(CliRunner().invoke(cli, ["runs", "--json"],
                                             env={"HPCTRAIN_RUNS_DIR": str(root)}).stdout)
    assert hpctrain.runs_table(root) == cli_rows == _truth(root)
    assert hpctrain.runs_table(str(root), limit=2) == cli_rows[:2]
    (root / INDEX_FILE).write_bytes(b"\x00garbage")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hpctrain.runs_table(root) == cli_rows
    assert [str(w.message).split(" ")[:3] for w in caught] == [["Warning:", "the", "runs"]]
    assert _indexed(root) == _kept_names(cli_rows)
    for bad in ({"limit": -1}, {"limit": True}, {"runs_dir": ""}):
        with pytest.raises(UsageError):
            hpctrain.runs_table(**bad)
