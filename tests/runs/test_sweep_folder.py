"""The one door of sweep folders (``hpctrain.record.sweeps``): whatever ``sweep.yaml`` holds
(YAML of any shape, bytes, a FIFO, a link, a folder), reading it is a sweep or one
``RunFileError`` line naming the file; its runs are run folders of the sweep or one error
line naming the entry; the tracker's check of a run's sweep folder never raises; and
``hpctrain report SWEEP`` exits 0 or 2 with one ``Error:`` line, writing nothing but its PNG
in the sweep's folder."""

from __future__ import annotations

import os
import shutil

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from hpctrain.errors import HpcTrainError
from hpctrain.record.files import RunFileError
from hpctrain.record.sweeps import (SWEEP_FILE, find_sweep, read_sweep, sweep_folder_of,
                                    sweep_runs)
from hpctrain.submission import prepare_sweep
from hpctrain.submission.sweep_values import expand
from tests.ops.helpers import OPS_JOB, cli, crafted_run, ops_job, ops_profile


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A prepared sweep of two runs and a run of no sweep, under one runs root."""
    root = tmp_path_factory.mktemp("sweeps") / "runs"
    points = expand(ops_job(), ops_profile(ranks_per_node=2), ["train.lr=1e-3,2e-3"])
    sweep_dir, runs = prepare_sweep(points, root, source=str(OPS_JOB))
    lone = crafted_run(root)
    return root, sweep_dir, [r.run for r in runs], lone


def _paths(made):
    root, sweep_dir, runs, lone = made
    return [str(r.path) for r in runs] + [str(lone.path), "/", "/etc", "relative/run", "",
                                          str(root / "gone"), str(sweep_dir), "a\0b"]


def _values(paths):
    scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
               | st.text(max_size=6) | st.sampled_from(paths))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["run_dir", "run", "index", "values", "job_id", "outcome", "id",
                         "runs"]), inner, max_size=4), max_leaves=10)


def _documents(paths):
    entry = st.fixed_dictionaries({"run_dir": _values(paths)},
                                  optional={"run": _values(paths), "index": _values(paths),
                                            "values": _values(paths)})
    shaped = st.fixed_dictionaries({"runs": st.lists(st.one_of(entry, _values(paths)),
                                                     max_size=4) | _values(paths)},
                                   optional={"id": _values(paths)})
    dumped = st.one_of(shaped, _values(paths)).map(
        lambda v: yaml.safe_dump(v, allow_unicode=True).encode("utf-8", "surrogatepass"))
    return st.one_of(st.tuples(st.just("yaml"), dumped),
                     st.tuples(st.just("bytes"), st.binary(max_size=200)),
                     st.tuples(st.sampled_from(["fifo", "folder", "link"]), st.just(b"")))


def _write(folder, kind, data):
    path = folder / SWEEP_FILE
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(data)


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


@settings(max_examples=60)
@given(data=st.data())
def test_any_sweep_file_is_a_sweep_or_one_error_line(made, data):
    root, sweep_dir, runs, lone = made
    kind, content = data.draw(_documents(_paths(made)))
    saved = (sweep_dir / SWEEP_FILE).read_bytes()
    try:
        _write(sweep_dir, kind, content)
        assert find_sweep(sweep_dir.name, root) == sweep_dir
        notes = []
        try:
            sweep = read_sweep(sweep_dir)
        except RunFileError as e:
            assert SWEEP_FILE in _one_line(e)
        else:
            try:
                listed = sweep_runs(sweep, notes.append)
            except HpcTrainError as e:
                _one_line(e)
            else:
                assert all(r.run_file.is_file() for r in listed)
                assert all(r.meta()["sweep"]["id"] == sweep.id for r in listed)
            assert all("\n" not in n for n in notes)
        for run in runs + [lone]:        # the trackers' check: a folder or None, never raises
            folder, why = sweep_folder_of(run.path, {"id": sweep_dir.name,
                                                     "dir": str(sweep_dir)})
            assert folder in (None, sweep_dir) and (folder is not None or why)
        before = sorted(p.name for p in sweep_dir.iterdir())
        out = cli(root, "report", sweep_dir.name, check=False)
        assert out.returncode in (0, 2), out.stderr
        if out.returncode == 2:
            (line,) = out.stderr.strip().splitlines()
            assert line.startswith("Error: ")
        after = sorted(p.name for p in sweep_dir.iterdir())
        assert set(after) - set(before) <= {"compare.png"}
    finally:
        _write(sweep_dir, "yaml", saved)
        if (sweep_dir / "compare.png").exists():
            (sweep_dir / "compare.png").unlink()


def test_the_sweep_file_is_rewritten_through_the_door_and_a_link_in_its_place_refused(tmp_path):
    """``write_sweep_file`` (after the array is submitted, after each local run) reads the file
    back through the door: kept fields stay; a link put in its place is one error, and neither
    the link nor what it points to is written."""
    from hpctrain.submission import write_sweep_file
    points = expand(ops_job(), ops_profile(ranks_per_node=2), ["train.lr=1e-3,2e-3"])
    sweep_dir, runs = prepare_sweep(points, tmp_path / "runs", source=str(OPS_JOB))
    created = read_sweep(sweep_dir).data["created"]
    runs[0].job_id = "41_0"
    write_sweep_file(sweep_dir, runs, array_job_id="41")
    sweep = read_sweep(sweep_dir)
    assert sweep.data["created"] == created and sweep.data["array_job_id"] == "41"
    assert [e.run_dir for e in sweep.entries] == [r.run.path for r in runs]
    target = tmp_path / "elsewhere.yaml"
    target.write_text("runs: []\n")
    (sweep_dir / SWEEP_FILE).unlink()
    (sweep_dir / SWEEP_FILE).symlink_to(target)
    with pytest.raises(RunFileError, match="symbolic link") as e:
        write_sweep_file(sweep_dir, runs)
    _one_line(e.value)
    assert target.read_text() == "runs: []\n" and (sweep_dir / SWEEP_FILE).is_symlink()
