"""``hpctrain report RUN RUN...`` and ``hpctrain report SWEEP``: several runs in one PNG.

Loss, validation loss (when the metrics carry one) and tokens/s of each run over the step axis,
one line per run, labelled by what differs between the runs: a sweep's values, else the job
settings whose values are not the same in all of them (``train.lr=0.0003, train.steps=200``);
the run id when nothing in the jobs differs. Each run's own files are only read. matplotlib is
imported when the figure is drawn, as for a single run's report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import yamlio
from ..config.schema import to_dict
from ..errors import HpcTrainError, UsageError
from ..record.folder import RunFolder, find_run
from ..record.sweeps import find_sweep, read_sweep, sweep_runs
from .report import evaluation_points, per_step
from ..submission.sweep_values import label

# settings that name a run rather than configure it: never a label
_NOT_LABELS = ("name", "checkpoint.dir")


@dataclass
class Series:
    run: RunFolder
    label: str
    steps: list[int]
    loss: list[float | None]
    tokens_per_s: list[float | None]
    validation: list[tuple[int, float]]     # (step, loss), at the evaluations' own steps

    def points(self, field: str) -> list[tuple[int, float]]:
        """(step, value) of ``field`` where it has one: validation at its own steps, the
        training values at the training records'."""
        if field == "val_loss":
            return self.validation
        return [(x, y) for x, y in zip(self.steps, getattr(self, field)) if y is not None]


def runs_of(refs: list[str], root: Path, note: Callable[[str], None] = lambda message: None
            ) -> tuple[list[RunFolder], Path | None]:
    """The runs named by ``refs`` (RUN as everywhere, or a sweep's id or folder: its runs, read
    through the one door of sweep folders, :mod:`hpctrain.record.sweeps`), each once, and the
    sweep's folder when one sweep was named. A run of the sweep whose folder is gone is left
    out (``note`` is told); an entry that is not a run of the sweep is an error naming it."""
    runs: dict[Path, RunFolder] = {}
    sweep_dir = None
    for ref in refs:
        folder = find_sweep(ref, root)
        if folder is not None:
            sweep_dir = folder if len(refs) == 1 else None
            for run in sweep_runs(read_sweep(folder), note):
                runs.setdefault(run.path, run)
            continue
        run = find_run(ref, root)
        runs.setdefault(run.path, run)
    if len(runs) < 2:
        raise UsageError("report: comparing needs at least two runs (give several RUNs or a "
                         "SWEEP with two or more runs); one run gets its own report")
    return list(runs.values()), sweep_dir


def labels(runs: list[RunFolder]) -> list[str]:
    """What differs between the runs: a sweep's values, else the job settings that differ."""
    values = [(r.meta().get("sweep") or {}).get("values") for r in runs]
    if all(values):
        return [label(v) for v in values]
    flat = []
    for run in runs:
        try:
            flat.append(_flatten(to_dict(run.resolved_job())))
        except HpcTrainError:
            flat.append({})
    keys = sorted({k for f in flat for k in f})
    differ = [k for k in keys if k not in _NOT_LABELS and len({repr(f.get(k)) for f in flat}) > 1]
    out = []
    for run, f in zip(runs, flat):
        text = label({k: f.get(k) for k in differ})
        out.append(text or run.shown)
    if len(set(out)) < len(out):       # the settings do not tell them apart: add the run id
        out = [f"{run.shown}: {text}" if text != run.shown else text
               for run, text in zip(runs, out)]
    return out


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def collect_series(runs: list[RunFolder]) -> list[Series]:
    def num(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    series = []
    for run, label in zip(runs, labels(runs)):
        records = per_step(run.metrics())
        series.append(Series(run, label, [m["step"] for m in records],
                             [num(m.get("loss")) for m in records],
                             [num(m.get("tokens_per_s")) for m in records],
                             evaluation_points(run, "validation")))
    return series


def build_comparison(series: list[Series], width_px: int = 1200, height_px: int = 900,
                     dpi: int = 100, title: str = ""):
    """One Figure: a panel each for loss, validation loss (if any run has it) and tokens/s;
    one line per run, ``gid`` = its run id, legend = its label."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    panels = [("loss", "loss")]
    if any(s.validation for s in series):
        panels.append(("val_loss", "validation loss"))
    panels.append(("tokens_per_s", "tokens/s"))
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (field, name) in zip(axes, panels):
        for s in series:
            pts = s.points(field)
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, linewidth=1.3, label=s.label, gid=f"{field}:{s.run.id}")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    # the legend on the first panel with a line (none when no run has a point to draw: an
    # empty legend is a matplotlib warning, not a figure)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper right")
            break
    axes[-1].set_xlabel("step")
    fig.suptitle(title or f"{len(series)} runs")
    fig.tight_layout()
    return fig


def comparison_summary(series: list[Series]) -> list[dict]:
    out = []
    for s in series:
        losses = [v for v in s.loss if v is not None]
        out.append({"run": s.run.id, "label": s.label, "last_step": s.steps[-1] if s.steps else None,
                    "last_loss": losses[-1] if losses else None,
                    "last_val_loss": s.validation[-1][1] if s.validation else None})
    return out
