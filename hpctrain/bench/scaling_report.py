"""What ``hpctrain bench scaling`` prints and draws: a table and a PNG, measured beside planned.

matplotlib is imported only when the PNG is drawn (Agg canvas, no display); without it the
table is all there is, and the result says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..record.folder import new_private_folder
from .scaling import TARGET_EFFICIENCY, ScalingResult

BENCH_DIR = "bench"

WIDTH_PX, HEIGHT_PX, DPI = 1200, 500, 100


def _num(x: float | None, fmt: str) -> str:
    return format(x, fmt) if x is not None else "-"


def table(result: ScalingResult) -> list[str]:
    first = result.sizes[0].resolved
    what = "CPU ranks" if first.profile.node.device == "cpu" else "GPUs"
    keep = ("global batch kept" if result.strong else
            f"micro batch {first.layout.micro_batch_size} × {first.layout.num_microbatches} "
            "microbatches per rank kept")
    lines = [f"{result.mode.capitalize()} scaling of {result.job_name} on {result.profile_name} "
             f"({keep}; {result.steps} steps, the first {result.warmup} not counted)",
             f"{'nodes':>5} {what:>9}  {'layout':<18} {'batch':>6}  {'tokens/s':>10} "
             f"{'per rank':>9} {'efficiency':>10}   {'planner tok/s':>13} {'planner eff.':>12}"]
    for s in result.sizes:
        per = s.tokens_per_s / s.world_size if s.tokens_per_s else None
        eff = _num(s.efficiency and 100 * s.efficiency, ".1f")
        peff = _num(s.predicted_efficiency and 100 * s.predicted_efficiency, ".1f")
        lines.append(
            f"{s.nodes:>5} {s.world_size:>9}  {s.resolved.layout.describe():<18} "
            f"{s.global_batch_size:>6}  {_num(s.tokens_per_s, ',.0f'):>10} {_num(per, ',.0f'):>9} "
            f"{eff + ('%' if eff != '-' else ''):>10}   {_num(s.predicted_tokens_per_s, ',.0f'):>13} "
            f"{peff + ('%' if peff != '-' else ''):>12}"
            + ("" if s.outcome == "finished" else f"   ({s.outcome})"))
    below = [s for s in result.sizes if s.efficiency is not None and s.efficiency < TARGET_EFFICIENCY]
    lines.append(f"target: more than {TARGET_EFFICIENCY:.0%} efficiency"
                 + (f"; below it at {', '.join(str(s.nodes) for s in below)} node(s)" if below
                    else ""))
    lines.append(f"planner: {result.prediction_basis}")
    lines += [f"note: {n}" for n in result.notes]
    return lines


def build_figure(result: ScalingResult):
    """Two panels over the number of GPUs: tokens/s per GPU and efficiency, measured and
    planned, with the 85% target."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    rate_ax, eff_ax = fig.subplots(1, 2)
    gpus = [s.world_size for s in result.sizes]

    def series(values):
        pts = [(g, v) for g, v in zip(gpus, values) if v is not None]
        return ([p[0] for p in pts], [p[1] for p in pts]) if pts else ([], [])

    measured = series([s.tokens_per_s / s.world_size if s.tokens_per_s else None
                       for s in result.sizes])
    planned = series([s.predicted_tokens_per_s / s.world_size if s.predicted_tokens_per_s
                      else None for s in result.sizes])
    rate_ax.plot(*measured, marker="o", color="tab:green", label="measured", gid="measured-rate")
    rate_ax.plot(*planned, marker="s", linestyle="--", color="tab:gray", label="planner",
                 gid="planned-rate")
    rate_ax.set_ylabel("tokens/s per rank")
    rate_ax.set_ylim(bottom=0)
    eff_m = series([s.efficiency for s in result.sizes])
    eff_p = series([s.predicted_efficiency for s in result.sizes])
    eff_ax.plot(*eff_m, marker="o", color="tab:green", label="measured", gid="measured-efficiency")
    eff_ax.plot(*eff_p, marker="s", linestyle="--", color="tab:gray", label="planner",
                gid="planned-efficiency")
    eff_ax.axhline(TARGET_EFFICIENCY, color="tab:red", linestyle=":",
                   label=f"target {TARGET_EFFICIENCY:.0%}", gid="target")
    eff_ax.set_ylabel("efficiency vs the smallest size")
    eff_ax.set_ylim(0, max([1.1] + [v * 1.05 for v in eff_m[1] + eff_p[1]]))
    for ax in (rate_ax, eff_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(gpus) / 1.4, max(gpus) * 1.4)   # the sizes, measured or not
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("CPU ranks" if result.sizes[0].resolved.profile.node.device == "cpu"
                      else "GPUs")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower left", fontsize=8)
    fig.suptitle(f"{result.mode} scaling of {result.job_name} on {result.profile_name} "
                 f"({result.steps} steps, {result.warmup} warm-up)")
    fig.tight_layout()
    return fig


def write_png(result: ScalingResult, path: Path) -> bool:
    """Draw the PNG; False when matplotlib is not installed (the table still stands)."""
    try:
        fig = build_figure(result)
    except ImportError:
        result.notes.append("no PNG: matplotlib is not installed (pip install 'hpctrain[report]')")
        return False
    from ..outputs import AtomicFile
    with AtomicFile(path) as f:
        fig.savefig(f, format="png", dpi=fig.dpi)
    result.png = path
    return True


def new_result_folder(runs_root: Path, name: str, mode: int = 0o700) -> Path:
    """``<runs root>/bench/<job>-scaling-<time>-<hex>``: the result's JSON and PNG, private like
    a run folder (``mode``); ``hpctrain runs`` does not list it."""
    return new_private_folder(runs_root / BENCH_DIR, f"{name}-scaling", mode)


def save(result: ScalingResult, folder: Path) -> None:
    """``scaling.png`` (when matplotlib is there) and ``scaling.json`` into ``folder``."""
    result.folder = folder
    write_png(result, folder / "scaling.png")
    from ..outputs import write_atomic
    write_atomic(folder / "scaling.json", json.dumps(result.to_json(), indent=1) + "\n")
