"""``hpctrain report``: draw a run's PNG report and print its path and a short summary."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from ..errors import UsageError
from .common import echo_json, find, json_option, run_argument, runs_dir_option


@click.command()
@run_argument
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the PNG (default: report.png in the run folder).")
@click.option("--size", default="1200x900", show_default=True, metavar="WxH",
              help="Image size in pixels.")
@runs_dir_option
@json_option
def report(run_ref, output, size, runs_dir, as_json):
    """Draw a PNG of a run: loss, tokens/s and MFU over steps, with preemptions, requeues and
    checkpoints marked; print its path and the numbers in a short summary.

    \b
    Example:
      hpctrain report tiny-gpt
      hpctrain report tiny-gpt -o /tmp/tiny.png --size 1600x1000
    """
    from ..ops.report import build_figure, collect, format_summary, summarize, write_png
    try:
        width, height = (int(x) for x in size.lower().split("x"))
        if width < 200 or height < 200:
            raise ValueError
    except ValueError:
        raise UsageError(f"--size {size!r}: expected WIDTHxHEIGHT in pixels, each at least 200 "
                         "(e.g. 1200x900)") from None
    run = find(run_ref, runs_dir)
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("hpctrain report needs matplotlib: pip install 'hpctrain[report]'")
    data = collect(run)
    path = (output or run.path / "report.png").resolve()
    write_png(build_figure(data, width, height), path)
    summary = summarize(data)
    if as_json:
        echo_json({"report": str(path), "width": width, "height": height, **summary})
        return
    click.echo(f"Report: {path} ({width}×{height})")
    click.echo(format_summary(summary))
