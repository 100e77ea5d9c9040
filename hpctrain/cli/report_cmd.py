"""``hpctrain report``: draw a run's PNG report and print its path and a short summary; or
several runs (a sweep's) in one PNG."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import click

from ..errors import UsageError
from .common import complete_runs, echo_json, find, json_option, runs_dir_option, runs_root


@click.command()
@click.argument("run_refs", metavar="RUN... | SWEEP", nargs=-1, required=True,
                shell_complete=complete_runs)
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the PNG (default: report.png in the run folder; for several "
                   "runs, compare.png in the sweep's folder or compare-<time>.png in the runs "
                   "folder).")
@click.option("--size", default="1200x900", show_default=True, metavar="WxH",
              help="Image size in pixels.")
@runs_dir_option
@json_option
def report(run_refs, output, size, runs_dir, as_json):
    """Draw a PNG of a run: loss, tokens/s and MFU over steps, with preemptions, requeues and
    checkpoints marked; print its path and the numbers in a short summary. Several runs, or a
    sweep, are drawn in one PNG: loss, validation loss and tokens/s, one line per run labelled
    by what differs between them.

    \b
    Example:
      hpctrain report tiny-gpt
      hpctrain report tiny-gpt -o /tmp/tiny.png --size 1600x1000
      hpctrain report tiny-gpt-20250101-120000-ab12 tiny-gpt-20250102-090000-cd34
      hpctrain report tiny-gpt-20250101-130000-ef56      # a sweep's id: all its runs
    """
    from .. import limits
    from ..config.safety import short
    low, high = limits.REPORT_PIXELS
    try:
        width, height = (int(x) for x in size.lower().split("x"))
        limits.integer("report_width", width)
        limits.integer("report_height", height)
    except (ValueError, UsageError):
        raise UsageError(f"--size {short(size)}: expected WIDTHxHEIGHT in pixels, each from "
                         f"{low:,} to {high:,} (e.g. 1200x900)") from None
    from ..ops.compare import runs_of
    root = runs_root(runs_dir)
    single = len(run_refs) == 1 and not _is_sweep(run_refs[0], root)
    run = find(run_refs[0], runs_dir) if single else None
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("hpctrain report needs matplotlib: pip install 'hpctrain[report]'")
    if not single:
        runs, sweep_dir = runs_of(list(run_refs), root, note=lambda m: click.echo(m, err=True))
        _compare(runs, sweep_dir, root, output, width, height, as_json)
        return
    from ..ops.report import (REPORT_FILE, build_figure, check_report_output, collect,
                              format_summary, summarize, write_png)
    path = check_report_output((output or run.path / REPORT_FILE).absolute(), "--output", run)
    data = collect(run)
    inside = Path(os.path.realpath(run.path))
    write_png(build_figure(data, width, height), path,
              within=inside if inside in Path(os.path.realpath(path)).parents else None)
    summary = summarize(data)
    if as_json:
        echo_json({"report": str(path), "width": width, "height": height, **summary})
        return
    click.echo(f"Report: {path} ({width}×{height})")
    click.echo(format_summary(summary))


def _is_sweep(ref: str, root: Path) -> bool:
    from ..record.sweeps import find_sweep
    return find_sweep(ref, root) is not None


def _compare(runs, sweep_dir: Path | None, root: Path, output, width: int, height: int,
             as_json: bool) -> None:
    import time

    from ..ops.compare import build_comparison, collect_series, comparison_summary
    from ..ops.report import check_report_output, write_png
    sweep_id = sweep_dir.name if sweep_dir is not None else None
    if output is None:       # the sweep's own folder, wherever it is (never a new one)
        output = (sweep_dir / "compare.png" if sweep_dir is not None else
                  root / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.png")
    # a link is refused, not followed; a file that is not a PNG, or a run's folder, too
    path = check_report_output(Path(output).absolute(), "--output")
    series = collect_series(runs)
    title = f"sweep {sweep_id}: {len(runs)} runs" if sweep_id else f"{len(runs)} runs"
    write_png(build_comparison(series, width, height, title=title), path)
    rows = comparison_summary(series)
    if as_json:
        echo_json({"report": str(path), "width": width, "height": height, "sweep": sweep_id,
                   "runs": rows})
        return
    click.echo(f"Report: {path} ({width}×{height}), {len(runs)} runs")
    from ..ops.fmt import format_table
    click.echo(format_table(["RUN", "STEP", "LOSS", "VAL LOSS", "LABEL"],
                            [[r["run"], r["last_step"], r["last_loss"], r["last_val_loss"],
                              r["label"]] for r in rows]))
