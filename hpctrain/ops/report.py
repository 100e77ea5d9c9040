"""``hpctrain report``: one PNG of a run (training and validation loss, tokens/s and MFU over
steps, with preemptions, requeues and checkpoints marked) and the same story in a few lines of
text.

matplotlib is imported only here, when a report is drawn, with its Agg canvas (no display, no
pyplot state). ``build_figure`` returns the Figure so tests can read the plotted data back.
Metrics are taken one record per step, the last one written: steps redone after a resume from
an older checkpoint replace the lost ones, as they did in training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..exit_codes import REQUEUE_REASONS, ExitReason
from ..file_door import printable, show
from ..record.folder import RunFolder
from .checkpoints import checkpoint_step, inspect_checkpoints
from .fmt import format_duration, format_gpu_hours, format_number

WIDTH_PX, HEIGHT_PX, DPI = 1200, 900, 100
RESTART_FIELDS = ("after_attempt", "excluded", "why", "spares", "in_place", "nodes",
                  "recovery_s", "steps_lost")


@dataclass
class ReportData:
    run_id: str
    steps: list[int]
    loss: list[float | None]
    tokens_per_s: list[float | None]
    mfu: list[float | None]
    preemptions: list[tuple[int, int]] = field(default_factory=list)   # (step, attempt)
    resumes: list[tuple[int, int]] = field(default_factory=list)       # (step, attempt)
    other_ends: list[tuple[int, str]] = field(default_factory=list)    # (step, exit reason)
    checkpoints: list[int] = field(default_factory=list)
    stragglers: list[tuple[int, str]] = field(default_factory=list)    # (step, node) named
    restarts: list[tuple[int, dict]] = field(default_factory=list)     # (attempt, in_job_restart)
    ledger: list[dict] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)   # (step, loss)
    test: list[tuple[int, float]] = field(default_factory=list)         # (step, loss)
    total_steps: int | None = None
    attempts: int = 0                  # started, recorded or not
    usage: dict = field(default_factory=dict)   # GpuHours.to_json(): GPU-hours used


def per_step(metrics: list[dict]) -> list[dict]:
    """One record per step (the last written), in step order."""
    by_step: dict[int, dict] = {}
    for m in metrics:
        if isinstance(m.get("step"), int):
            by_step[m["step"]] = m
    return [by_step[s] for s in sorted(by_step)]


def _num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def evaluation_points(run: RunFolder, kind: str) -> list[tuple[int, float]]:
    """(step, loss) of the run's ``kind`` evaluations (validation or test; the last record of
    a step, non-finite losses left out), each at its own step: ``train.eval_interval`` need
    not be a multiple of ``train.log_interval``, so they are not looked up by training step."""
    return [(m["step"], _num(m.get("loss"))) for m in per_step(run.metrics(kind=kind))
            if _num(m.get("loss")) is not None]


def collect(run: RunFolder) -> ReportData:
    records = per_step(run.metrics())
    ledger = run.ledger()
    data = ReportData(run_id=run.id, steps=[m["step"] for m in records],
                      loss=[_num(m.get("loss")) for m in records],
                      tokens_per_s=[_num(m.get("tokens_per_s")) for m in records],
                      mfu=[_num(m.get("mfu")) for m in records], ledger=ledger,
                      attempts=max([len(ledger)] + run.attempts_started()))
    data.validation = evaluation_points(run, "validation")
    data.test = evaluation_points(run, "test")
    data.stragglers = [(m["step"], node_name(n.get("node"))) for m in records
                       for n in (m.get("stragglers") or []) if isinstance(n, dict)]
    for i, rec in enumerate(ledger):
        end, reason = rec.get("end_step"), rec.get("exit_reason")
        if isinstance(end, int) and reason in REQUEUE_REASONS:
            data.preemptions.append((end, int(rec.get("attempt") or i + 1)))
        elif isinstance(end, int) and reason not in (ExitReason.FINISHED, None):
            data.other_ends.append((end, str(reason)))
        attempt = int(rec.get("attempt") or i + 1)
        if attempt > 1 and isinstance(rec.get("start_step"), int):
            data.resumes.append((rec["start_step"], attempt))
    events = run.events()
    data.restarts = in_job_restarts(ledger, events)
    steps = {checkpoint_step(r.get("checkpoint_saved")) for r in ledger}
    steps |= {e.get("step") for e in events  # the runtime's saves, pruned ones included
              if e.get("event") == "checkpoint_saved" and isinstance(e.get("step"), int)}
    try:
        steps |= {c.step for c in inspect_checkpoints(run).checkpoints if c.complete}
    except OSError:
        pass
    data.checkpoints = sorted(s for s in steps if s is not None)
    try:
        data.total_steps = run.resolved_job().train.steps
    except Exception:
        data.total_steps = None
    from ..view.cost import gpu_hours
    data.usage = gpu_hours(run).to_json()
    return data


def build_figure(data: ReportData, width_px: int = WIDTH_PX, height_px: int = HEIGHT_PX,
                 dpi: int = DPI):
    """The report as a matplotlib Figure (Agg canvas): three panels sharing the step axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 1, sharex=True)
    panels = [("loss", data.loss, "loss", "tab:blue"),
              ("tokens_per_s", data.tokens_per_s, "tokens/s", "tab:green"),
              ("mfu", data.mfu, "MFU", "tab:purple")]
    for ax, (name, values, label, color) in zip(axes, panels):
        pts = [(s, v) for s, v in zip(data.steps, values) if v is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, color=color, linewidth=1.4, label=name, gid=name)
        else:
            ax.text(0.5, 0.5, f"no {label} recorded" + (" (set node.peak_tflops in the profile)"
                                                        if name == "mfu" else ""),
                    transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        for i, (step, attempt) in enumerate(data.preemptions):
            ax.axvline(step, color="tab:red", linestyle="--", linewidth=1.2,
                       label="preempted" if i == 0 else None, gid=f"preempted-{attempt}")
        for i, (step, attempt) in enumerate(data.resumes):
            ax.axvline(step, color="tab:orange", linestyle=":", linewidth=1.5,
                       label="requeued / resumed" if i == 0 else None, gid=f"resumed-{attempt}")
        starts = {a: step for step, a in data.resumes}
        for i, (attempt, r) in enumerate(data.restarts):
            if attempt in starts:
                ax.axvline(starts[attempt], color="tab:cyan", linestyle="-", linewidth=1.5,
                           label="restarted in the job" if i == 0 else None,
                           gid=f"in-job-restart-{attempt}")
        for i, (step, reason) in enumerate(data.other_ends):
            ax.axvline(step, color="black", linestyle="-.", linewidth=1,
                       label="attempt ended" if i == 0 else None, gid=f"ended-{reason}")
    if data.validation:
        xs, ys = zip(*data.validation)
        axes[0].plot(xs, ys, color="tab:orange", linewidth=1.4, marker="o", markersize=4,
                     label="validation loss", gid="validation_loss")
    if data.test:
        xs, ys = zip(*data.test)
        axes[0].plot(xs, ys, linestyle="none", marker="*", markersize=10, color="tab:brown",
                     label="test loss", gid="test_loss")
    speed_ax, at_step = axes[1], dict(zip(data.steps, data.tokens_per_s))
    for node in sorted({n for _, n in data.stragglers}):
        pts = [(s, at_step.get(s) or 0.0) for s, n in data.stragglers if n == node]
        xs, ys = zip(*pts)
        speed_ax.plot(xs, ys, linestyle="none", marker="x", markersize=9, color="tab:red",
                      label=f"straggler {node}", gid=f"straggler-{node}")
        speed_ax.annotate(f"straggler {node}", (xs[0], ys[0]), textcoords="offset points",
                          xytext=(4, 6), fontsize=8, color="tab:red")
    if data.stragglers:
        speed_ax.legend(loc="lower right", fontsize=8)
    loss_ax = axes[0]
    if data.checkpoints:
        at = dict(zip(data.steps, data.loss))
        ys = [at.get(s) for s in data.checkpoints]
        known = [y for y in data.loss if y is not None]
        floor = min(known) if known else 0.0
        loss_ax.plot(data.checkpoints, [y if y is not None else floor for y in ys], linestyle="none",
                     marker="v", markersize=8, color="tab:gray", label="checkpoint", gid="checkpoints")
    if data.total_steps:
        loss_ax.set_xlim(0, 1.02 * max([data.total_steps] + data.steps))
    if loss_ax.get_legend_handles_labels()[0]:   # a run with nothing marked yet has no legend
        loss_ax.legend(loc="upper right", fontsize=8)   # (matplotlib would warn on stderr)
    axes[-1].set_xlabel("step")
    attempts = max(data.attempts, len(data.ledger))
    fig.suptitle(f"{data.run_id}: {attempts} attempt{'s' if attempts != 1 else ''}, "
                 f"{len(data.preemptions)} preempted, {len(data.checkpoints)} checkpoints")
    fig.tight_layout()
    return fig


def write_png(fig, path: Path, within: Path | None = None) -> None:
    """Save ``fig`` as a PNG at ``path`` through the write door (``outputs.AtomicFile``): a
    reader sees the old picture or the new one, and a link planted at ``path`` or at a
    temporary name is never written through. ``within``: the run folder ``path`` lies in,
    never made again if it was removed meanwhile."""
    from ..outputs import AtomicFile
    with AtomicFile(path, within=within) as f:
        # no bbox_inches="tight": the PNG keeps the asked-for size
        fig.savefig(f, format="png", dpi=fig.dpi)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPORT_FILE = "report.png"      # where a run's report goes in its own folder (the default)
# every place in its own folder a run's report may go: the default, and where the trackers'
# sender draws the PNG it uploads (tracking/sender.py)
OWN_REPORT_FILES = (REPORT_FILE, "tracking/report.png")


def check_report_output(path: Path, option: str, own_run: RunFolder | None = None) -> Path:
    """``path`` if a report may be written there; UsageError naming ``option`` and the fix,
    before anything is drawn, otherwise. A report replaces only a PNG (an earlier report: its
    signature is read through the run-folder reader, never the whole file), so a ledger, a
    run.yaml or any other file named by mistake is never overwritten; and inside a run folder it
    goes only where ``report`` puts it by default, ``own_run``'s ``report.png``, or where the
    trackers draw it, its ``tracking/report.png`` (a run's folder holds its records; another
    run's folder is never written). What the write door refuses (a
    link, a FIFO, a folder) is refused here too (``outputs.check_output_file``)."""
    import os

    from ..errors import UsageError
    from ..outputs import check_output_file
    from ..record import reader
    from ..record.folder import is_run_folder
    path = check_output_file(path, option)
    real = Path(os.path.realpath(path.parent)) / path.name
    allowed = {Path(os.path.realpath(own_run.path)) / name for name in OWN_REPORT_FILES} \
        if own_run is not None else set()
    for above in real.parents:
        if is_run_folder(above):
            if real not in allowed:
                raise UsageError(
                    f"{option} {path}: is inside run folder {above}, which holds that run's "
                    f"records; a report goes in a run folder only as its own {REPORT_FILE} "
                    f"(the default): give a path outside the run folders, or leave {option} out")
            break
    try:
        head = reader.read_head(path, len(PNG_SIGNATURE))
    except reader.DamagedFile as e:
        raise UsageError(f"{option} {path}: {e.why}; give the path of a new file") from None
    if head is not None and head != PNG_SIGNATURE:
        raise UsageError(f"{option} {path}: exists and is not a PNG; a report replaces only "
                         f"an earlier report: give a new file name (or move that file away)")
    return path


def summarize(data: ReportData) -> dict:
    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None
    losses = [(s, v) for s, v in zip(data.steps, data.loss) if v is not None]
    best = min(losses, key=lambda p: p[1]) if losses else None
    requeues = sum(1 for r in data.ledger if (r.get("decision") or {}).get("requeue"))
    restarts = [r for _, r in data.restarts]
    recoveries = [r.get("recovery_s") for r in restarts
                  if isinstance(r.get("recovery_s"), (int, float))]
    return {
        "run": data.run_id, "first_step": data.steps[0] if data.steps else None,
        "last_step": data.steps[-1] if data.steps else None, "total_steps": data.total_steps,
        "attempts": max(data.attempts, len(data.ledger)), "preemptions": len(data.preemptions), "requeues": requeues,
        "in_job_restarts": len(restarts),
        "excluded_in_job": [n for r in restarts for n in r.get("excluded") or []],
        "in_job_recovery_s": max(recoveries) if recoveries else None,
        "in_job_restart_details": [{"attempt": a, **{k: r.get(k) for k in RESTART_FIELDS}}
                                   for a, r in data.restarts],
        "checkpoints": data.checkpoints,
        "first_loss": losses[0][1] if losses else None, "last_loss": losses[-1][1] if losses else None,
        "min_loss": best[1] if best else None, "min_loss_step": best[0] if best else None,
        "last_validation_loss": data.validation[-1][1] if data.validation else None,
        "last_validation_step": data.validation[-1][0] if data.validation else None,
        "test_loss": data.test[-1][1] if data.test else None,
        "mean_tokens_per_s": mean(data.tokens_per_s), "mean_mfu": mean(data.mfu),
        "training_time_s": sum(r.get("duration_s") or 0 for r in data.ledger) or None,
        "stragglers": {node: min(s for s, n in data.stragglers if n == node)
                       for node in sorted({n for _, n in data.stragglers})},
        "gpu_hours": data.usage.get("gpu_hours"),
        "gpu_hours_source": data.usage.get("gpu_hours_source"),
    }


def format_summary(s: dict) -> str:
    lines = []
    if s["last_step"] is None:
        lines.append("No metrics recorded yet.")
    else:
        total = f" of {s['total_steps']}" if s.get("total_steps") else ""
        lines.append(f"Steps       {s['first_step']}→{s['last_step']}{total}")
    restarted = (f", {s['in_job_restarts']} restarted in the job"
                 + (f" (left out {', '.join(_names(s['excluded_in_job']))})" if s['excluded_in_job']
                    else "") if s.get("in_job_restarts") else "")
    lines.append(f"Attempts    {s['attempts']} ({s['preemptions']} preempted, {s['requeues']} requeued"
                 f"{restarted})"
                 + (f", {format_duration(s['training_time_s'])} in jobs" if s.get("training_time_s") else ""))
    if s.get("gpu_hours") is not None:
        lines.append(f"GPU-hours   {format_gpu_hours(s['gpu_hours'])} (from "
                     f"{s.get('gpu_hours_source')})")
    ck = s["checkpoints"]
    lines.append(f"Checkpoints {len(ck)}" + (f" (steps {', '.join(map(str, ck))})" if ck else ""))
    if s["last_loss"] is not None:
        lines.append(f"Loss        {format_number(s['first_loss'])} → {format_number(s['last_loss'])} "
                     f"(min {format_number(s['min_loss'])} at step {s['min_loss_step']})")
    if s.get("last_validation_loss") is not None:
        lines.append(f"Validation  {format_number(s['last_validation_loss'])} at step "
                     f"{s['last_validation_step']}"
                     + (f"; test {format_number(s['test_loss'])}" if s.get("test_loss") is not None
                        else ""))
    if s["mean_tokens_per_s"] is not None:
        lines.append(f"Throughput  {format_number(s['mean_tokens_per_s'])} tokens/s (mean)")
    if s["mean_mfu"] is not None:
        lines.append(f"MFU         {100 * s['mean_mfu']:.1f}% (mean)")
    for r in s.get("in_job_restart_details") or []:
        lines.append(f"Restart     attempt {r.get('attempt')}{after_attempt(r, ' after ')}: "
                     + restart_text(r))
    if s.get("stragglers"):
        lines.append("Stragglers  " + ", ".join(f"{node} (named at step {step})"
                                                for node, step in s["stragglers"].items()))
    # every value above from a record is in show()'s form; a field added later without it
    # still cannot act on the terminal
    return printable("\n".join(lines))


def node_name(value) -> str:
    """A node name as a record holds it (metrics' stragglers, a restart's nodes), printed: in
    the one printable form of what is found on disk (``file_door.show``), whatever its type,
    so a name holding an escape code cannot retitle or clear the terminal."""
    return show(value if isinstance(value, str) else str(value))


def _names(value) -> list[str]:
    return [node_name(v) for v in value] if isinstance(value, list) else []


def after_attempt(r: dict, words: str) -> str:
    """``words`` and N, the attempt a restart came after; nothing when its record does not say
    which (never "after None")."""
    n = r.get("after_attempt")
    return f"{words}{n}" if isinstance(n, int) and not isinstance(n, bool) else ""


def restart_text(r: dict) -> str:
    """One in-job restart in words: which node was left out and why, which spare took its
    place (or in place on which nodes), what the recovery cost; ``status`` says it too."""
    if r.get("in_place"):
        how = f"in place on {', '.join(_names(r.get('nodes'))) or 'the same nodes'}"
    else:
        how = ", ".join(f"{a} -> {b}" for a, b in zip(_names(r.get("excluded")),
                                                     _names(r.get("spares")))) or "new nodes"
    cost = []
    if isinstance(r.get("recovery_s"), (int, float)):
        cost.append(f"{format_duration(r['recovery_s'])} from the failure to the first step")
    if isinstance(r.get("steps_lost"), int):
        cost.append(f"{r['steps_lost']} step{'' if r['steps_lost'] == 1 else 's'} redone")
    why = show(str(r.get("why") or "failure"))
    return f"{how} ({why})" + (f"; {', '.join(cost)}" if cost else "")


def in_job_restarts(ledger: list[dict], events: list[dict]) -> list[tuple[int, dict]]:
    """(attempt, restart) for each attempt that began by an in-job restart: its ledger
    record's ``in_job_restart``, or, for an attempt still training (no record yet), the
    ``in_job_restart`` event its rank 0 wrote at its first step."""
    found: dict[int, dict] = {}
    for e in events:
        if e.get("event") == "in_job_restart" and isinstance(e.get("attempt"), int):
            found[e["attempt"]] = e
    for i, rec in enumerate(ledger):
        if isinstance(rec.get("in_job_restart"), dict):
            found[int(rec.get("attempt") or i + 1)] = rec["in_job_restart"]
    return sorted(found.items())
