"""Several runs in one PNG: ``hpctrain report RUN RUN...`` and ``report SWEEP`` overlay loss,
validation loss and tokens/s by step, one line per run, labelled by what differs."""

from __future__ import annotations

import json

import pytest

from hpctrain.ops.compare import build_comparison, collect_series
from hpctrain.submission.sweep_values import expand
from hpctrain.record.files import append_jsonl
from hpctrain.submission import prepare_sweep
from tests.ops.helpers import OPS_JOB, cli, crafted_run, ops_job, ops_profile, png_size


def metrics(loss0: float, n: int = 5, val: bool = False) -> list[dict]:
    train = [{"step": s, "loss": loss0 - 0.1 * s, "tokens_per_s": 1000.0 + s}
             for s in range(1, n + 1)]
    return train + [{"kind": "validation", "step": s, "loss": loss0 - 0.05 * s}
                    for s in range(2, n + 1, 2) if val]


def test_runs_are_labelled_by_the_job_settings_that_differ(tmp_path):
    root = tmp_path / "runs"
    short = crafted_run(root, steps=20, metrics=metrics(3.0))
    long = crafted_run(root, steps=30, metrics=metrics(3.5, val=True))
    series = collect_series([short, long])
    assert [s.label for s in series] == ["train.steps=20", "train.steps=30"]
    fig = build_comparison(series)
    loss_ax, val_ax, speed_ax = fig.axes
    assert [line.get_label() for line in loss_ax.get_lines()] == ["train.steps=20", "train.steps=30"]
    assert [line.get_gid() for line in val_ax.get_lines()] == [f"val_loss:{long.id}"]
    assert list(val_ax.get_lines()[0].get_xdata()) == [2, 4]
    assert list(speed_ax.get_lines()[1].get_ydata()) == [1001.0, 1002.0, 1003.0, 1004.0, 1005.0]
    out = json.loads(cli(root, "report", short.id, long.id, "-o", str(tmp_path / "c.png"),
                         "--size", "800x600", "--json").stdout)
    assert png_size(tmp_path / "c.png") == (800, 600)
    assert [(r["run"], r["label"], r["last_step"], r["last_val_loss"]) for r in out["runs"]] == \
        [(short.id, "train.steps=20", 5, None), (long.id, "train.steps=30", 5, 3.3)]


def test_validation_between_the_logged_steps_is_drawn_and_its_last_is_reported(tmp_path):
    """``train.log_interval: 10`` and ``train.eval_interval: 25``: validation at 25, 50 and 75
    has a training record at 50 only. Each validation point is drawn at its own step, and
    the table's VAL LOSS is step 75's, as a single run's report has it."""
    root = tmp_path / "runs"
    train = [{"kind": "train", "step": s, "loss": 4.0 - 0.01 * s, "tokens_per_s": 1000.0}
             for s in range(10, 81, 10)]
    validation = [{"kind": "validation", "step": s, "loss": v}
                  for s, v in ((25, 3.5), (50, 3.25), (75, 3.125))]
    runs = [crafted_run(root, steps=steps, metrics=train + validation[:shown])
            for steps, shown in ((80, 3), (90, 0))]
    fig = build_comparison(collect_series(runs))
    val_ax = fig.axes[1]
    (line,) = val_ax.get_lines()
    assert line.get_gid() == f"val_loss:{runs[0].id}"
    assert (list(line.get_xdata()), list(line.get_ydata())) == ([25, 50, 75], [3.5, 3.25, 3.125])
    out = json.loads(cli(root, "report", runs[0].id, runs[1].id, "-o", str(tmp_path / "c.png"),
                         "--json").stdout)
    assert [(r["run"], r["last_step"], r["last_val_loss"]) for r in out["runs"]] == \
        [(runs[0].id, 80, 3.125), (runs[1].id, 80, None)]


def _sweep_with_metrics(root, spec: str):
    """A sweep prepared under ``root`` whose runs each logged a few steps (run i at loss 3 + i)."""
    points = expand(ops_job(), ops_profile(ranks_per_node=2), [spec])
    sweep_dir, runs = prepare_sweep(points, root, source=str(OPS_JOB))
    for i, r in enumerate(runs):
        for m in metrics(3.0 + i):
            append_jsonl(r.run.metrics_file, m)
    return sweep_dir, runs


def test_a_sweep_is_one_png_in_its_folder_labelled_by_its_values(tmp_path):
    root = tmp_path / "runs"
    sweep_dir, runs = _sweep_with_metrics(root, "train.lr=1e-3,2e-3,3e-3")
    text = cli(root, "report", sweep_dir.name).stdout
    assert text.startswith(f"Report: {sweep_dir / 'compare.png'} (1200×900), 3 runs")
    assert png_size(sweep_dir / "compare.png") == (1200, 900)
    for r in runs:
        assert f"train.lr={r.point.values['train.lr']}" in text and r.run.id in text
    one = cli(root, "report", runs[0].run.id, runs[0].run.id, check=False)
    assert one.returncode == 2 and "comparing needs at least two runs" in one.stderr


def test_sweep_values_edited_to_hold_control_characters_are_printed_escaped_on_one_line(tmp_path):
    """A run.yaml edited by hand (or by another tool) may hold anything in its sweep's id and
    values: ``status`` and ``report`` print them in the form the sweep's own labels take
    (quoted, escapes shown), so no escape code reaches the terminal and no line is added."""
    from hpctrain.config import yamlio
    root = tmp_path / "runs"
    sweep_dir, runs = _sweep_with_metrics(root, "train.lr=1e-3,2e-3")
    run = runs[0].run
    meta = yamlio.read_mapping(run.run_file)
    meta["sweep"]["id"] += "\x1b[31m"
    meta["sweep"]["values"] = {"train.lr": "1e-3\x1b[2J\nFAKE LINE", "k\x1b]0;title\x07": 1}
    yamlio.write_atomic(run.run_file, yamlio.dump(meta))
    shown = "train.lr='1e-3\\x1b[2J\\nFAKE LINE', 'k\\x1b]0;title\\x07'=1"
    status = cli(root, "status", run.id).stdout
    (line,) = [ln for ln in status.splitlines() if ln.startswith("Sweep")]
    assert line == f"Sweep       '{sweep_dir.name}\\x1b[31m' #0: {shown}"
    report = cli(root, "report", run.id, runs[1].run.id, "-o", str(tmp_path / "c.png")).stdout
    assert report.splitlines()[2].endswith(shown) and len(report.splitlines()) == 4, report
    for out in (status, report):
        assert not any(c in out for c in "\x1b\x07"), out
        assert not any(ln.startswith("FAKE") for ln in out.splitlines()), out


# ---- report SWEEP: sweep.yaml read through the one door of sweep folders ---------------------


def _sweep_file(sweep_dir, text: str) -> None:
    (sweep_dir / "sweep.yaml").write_text(text)


@pytest.mark.parametrize("runs, named", [
    ("[{run_dir: 5}, {run_dir: RUN}]", "runs[0].run_dir: expected a path"),
    ("[{run_dir: [1]}, {run_dir: RUN}]", "runs[0].run_dir: expected a path"),
    ("[{run_dir: RUN}, {run_dir: relative/run}]", "runs[1].run_dir: expected a path (absolute"),
    ("7", "runs: expected a list of the sweep's runs, got 7"),
    ("[5, {run_dir: RUN}]", "runs[0]: expected a run of the sweep"),
    ("[{run: x}]", "runs[0].run_dir: missing"),
])
def test_a_sweep_file_of_the_wrong_shape_is_one_line_naming_the_field(tmp_path, runs, named):
    root = tmp_path / "runs"
    sweep_dir, swept = _sweep_with_metrics(root, "train.lr=1e-3,2e-3")
    runs = runs.replace("RUN", str(swept[0].run.path))
    _sweep_file(sweep_dir, f"id: {sweep_dir.name}\nruns: {runs}\n")
    out = cli(root, "report", sweep_dir.name, check=False)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"Error: cannot read {sweep_dir / 'sweep.yaml'}: {named}"), line
    assert not (sweep_dir / "compare.png").exists()


@pytest.mark.parametrize("entry", ["/", "/etc", "OTHER"])
def test_a_sweep_entry_that_is_not_a_run_of_the_sweep_is_refused_naming_it(tmp_path, entry):
    """``/``, ``/etc`` (no run.yaml) or a run of no sweep are never drawn as the sweep's runs."""
    root = tmp_path / "runs"
    sweep_dir, swept = _sweep_with_metrics(root, "train.lr=1e-3,2e-3")
    other = crafted_run(root, metrics=metrics(4.0))
    shown = str(other.path) if entry == "OTHER" else entry
    _sweep_file(sweep_dir, f"id: {sweep_dir.name}\nruns:\n- run_dir: {swept[0].run.path}\n"
                           f"- run_dir: {shown}\n")
    out = cli(root, "report", sweep_dir.name, check=False)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"Error: {sweep_dir / 'sweep.yaml'}: runs[1].run_dir: "), line
    assert ("is not a run of sweep" if entry == "OTHER" else "is not a run folder") in line
    assert not (sweep_dir / "compare.png").exists()


def test_a_run_of_the_sweep_removed_since_is_left_out_with_a_note(tmp_path):
    root = tmp_path / "runs"
    sweep_dir, swept = _sweep_with_metrics(root, "train.lr=1e-3,2e-3,3e-3")
    cli(root, "runs", "rm", swept[1].run.id)
    out = cli(root, "report", sweep_dir.name)
    assert f"run {swept[1].run.id} is left out: its folder" in out.stderr
    assert out.stdout.startswith(f"Report: {sweep_dir / 'compare.png'} (1200×900), 2 runs")
    assert swept[1].run.id not in out.stdout


def test_a_sweep_given_by_a_folder_outside_the_runs_root_is_drawn_in_that_folder(tmp_path):
    import shutil
    root = tmp_path / "runs"
    sweep_dir, _ = _sweep_with_metrics(root, "train.lr=1e-3,2e-3")
    outside = tmp_path / "elsewhere" / "extsweep"
    shutil.copytree(sweep_dir, outside)
    text = cli(root, "report", str(outside)).stdout
    assert text.startswith(f"Report: {outside / 'compare.png'} (1200×900), 2 runs")
    assert png_size(outside / "compare.png") == (1200, 900)
    assert sorted(p.name for p in (root / "sweeps").iterdir()) == [sweep_dir.name]
    assert not (sweep_dir / "compare.png").exists()


def test_runs_with_nothing_to_draw_make_a_figure_without_a_warning(tmp_path):
    """Two runs with no metrics yet: no line anywhere, so no legend (matplotlib warns of an
    empty legend); a run with only tokens/s puts the legend on that panel."""
    import warnings
    root = tmp_path / "runs"
    runs = [crafted_run(root, steps=20), crafted_run(root, steps=30)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = build_comparison(collect_series(runs))
        assert all(ax.get_legend() is None for ax in fig.axes)
        append_jsonl(runs[1].metrics_file, {"step": 1, "tokens_per_s": 10.0})
        fig = build_comparison(collect_series(runs))
        assert [ax.get_legend() is not None for ax in fig.axes] == [False, True]
    out = cli(root, "report", runs[0].id, runs[1].id, "-o", str(tmp_path / "c.png"))
    assert "Warning" not in out.stderr and out.stderr == ""
