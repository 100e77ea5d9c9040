"""How often to checkpoint: Young/Daly's interval from a save's cost and the failure rate.

A periodic save costs its blocking time δ every time; a failure costs the work since the last
save (on average half an interval, plus the save in progress) and a restart. Saving more often
trades the first for the second. Young (1974) found the interval of work between saves that
minimizes the sum, τ ≈ √(2δM) for a job whose mean time between failures is M; Daly (2006)
refined it to

    τ = √(2δM) · [1 + ⅓·√(δ/2M) + δ/(18M)] − δ     for δ < 2M,   else τ = M

(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
Future Generation Computer Systems 22(3), 2006). ``checkpoint.interval_minutes: auto`` uses it
with δ the measured blocking time of a save and M = ``reliability.node_mtbf_hours`` / nodes
(nodes fail independently, so a job on n nodes fails n times as often as one node).

The expected fractions of time lost, to first order (the terms Young's interval balances):
saves δ/τ, and lost work ((τ + δ)/2 + R)/M per unit of time, R the restart's cost when known.

Pure arithmetic: the planner (``hpctrain plan``) and the runtime share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Meta's Llama 3 405B pre-training saw 419 unexpected interruptions in a 54-day snapshot on
# 16,384 H100 GPUs, i.e. 2,048 nodes of 8 ("The Llama 3 Herd of Models", 2024, section 3.3.4):
# 2048 × 54 × 24 h / 419 ≈ 6,300 hours between failures per node. Rounded down: a cluster
# that fails a little more often than a mature, closely watched one.
DEFAULT_NODE_MTBF_HOURS = 6000.0
# Never save more often than this, whatever δ: a save of a few milliseconds (a tiny model)
# would otherwise be asked for after every step.
MIN_INTERVAL_S = 60.0


def daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum of the work between two saves, in seconds."""
    if not (delta_s >= 0 and mtbf_s > 0) or math.isinf(delta_s) or math.isnan(mtbf_s):
        raise ValueError(f"need a save time δ ≥ 0 and an MTBF M > 0, got δ={delta_s}, M={mtbf_s}")
    if math.isinf(mtbf_s):
        return math.inf
    if delta_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = delta_s / (2 * mtbf_s)
    return (math.sqrt(2 * delta_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9)
            - delta_s)


def young_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum √(2δM) (for comparison; Daly's is what is used)."""
    return math.sqrt(2 * delta_s * mtbf_s)


def job_mtbf_s(node_mtbf_hours: float, nodes: int) -> float:
    """The job's mean time between failures: any one of its nodes failing stops it."""
    if node_mtbf_hours <= 0 or nodes < 1:
        raise ValueError(f"need node_mtbf_hours > 0 and nodes ≥ 1, got {node_mtbf_hours}, {nodes}")
    return node_mtbf_hours * 3600.0 / nodes


@dataclass(frozen=True)
class IntervalEstimate:
    """One checkpoint interval and what it is expected to cost.

    ``interval_s`` is the work between two saves (None: no periodic saves); ``chosen`` says
    where it came from: "auto" (Daly's formula) or "fixed" (the job's number)."""

    delta_s: float                 # blocking time of one save
    delta_source: str              # how δ was known: "measured", "previous attempt", ...
    node_mtbf_hours: float
    nodes: int
    interval_s: float | None
    chosen: str = "auto"
    restart_s: float | None = None
    optimum_s: float | None = None  # Daly's interval, for a fixed one to be compared with

    @property
    def mtbf_s(self) -> float:
        return job_mtbf_s(self.node_mtbf_hours, self.nodes)

    @property
    def save_fraction(self) -> float:
        """Time lost to saves: δ per τ of work."""
        if not self.interval_s:
            return 0.0
        return self.delta_s / self.interval_s

    @property
    def lost_work_fraction(self) -> float | None:
        """Time lost to failures: on average (τ + δ)/2 of work redone, plus the restart, per
        failure, one failure per M. None without periodic saves (everything since the
        attempt began is lost: not a fraction)."""
        if not self.interval_s or math.isinf(self.interval_s):
            return None
        return ((self.interval_s + self.delta_s) / 2 + (self.restart_s or 0.0)) / self.mtbf_s

    @property
    def total_fraction(self) -> float | None:
        lost = self.lost_work_fraction
        return None if lost is None else self.save_fraction + lost

    def to_json(self) -> dict:
        return {"chosen": self.chosen, "interval_s": _round(self.interval_s),
                "delta_s": round(self.delta_s, 3), "delta_source": self.delta_source,
                "mtbf_s": round(self.mtbf_s, 1), "node_mtbf_hours": self.node_mtbf_hours,
                "nodes": self.nodes, "restart_s": _round(self.restart_s),
                "save_fraction": round(self.save_fraction, 6),
                "lost_work_fraction": _round(self.lost_work_fraction, 6),
                "optimum_interval_s": _round(self.optimum_s)}

    def describe(self) -> str:
        """One line: the interval, the numbers behind it, and what it costs."""
        every = "no periodic saves" if not self.interval_s else f"every {minutes(self.interval_s)}"
        how = "Young/Daly" if self.chosen == "auto" else "fixed"
        mtbf_h = self.mtbf_s / 3600
        text = (f"{every} ({how}: save blocks δ {self.delta_s:.2f} s [{self.delta_source}], "
                f"job MTBF M {mtbf_h:,.1f} h = {self.node_mtbf_hours:g} h per node / "
                f"{self.nodes} node{'s' if self.nodes != 1 else ''})")
        lost = self.lost_work_fraction
        if lost is not None:
            restart = (f", restart {self.restart_s:.0f} s counted" if self.restart_s else "")
            text += (f"; expected time lost: saves {percent(self.save_fraction)}, lost work "
                     f"{percent(lost)}{restart}")
        if self.chosen != "auto" and self.optimum_s is not None:
            text += f"; Young/Daly would save every {minutes(self.optimum_s)}"
        return text


def estimate(delta_s: float, node_mtbf_hours: float, nodes: int, *, delta_source: str = "",
             interval_s: float | None = None, restart_s: float | None = None) -> IntervalEstimate:
    """The interval ``auto`` chooses (``interval_s`` None), or what a fixed one costs."""
    mtbf = job_mtbf_s(node_mtbf_hours, nodes)
    optimum = max(MIN_INTERVAL_S, daly_interval_s(delta_s, mtbf))
    if interval_s is None:
        return IntervalEstimate(delta_s, delta_source, node_mtbf_hours, nodes, optimum, "auto",
                                restart_s, optimum)
    return IntervalEstimate(delta_s, delta_source, node_mtbf_hours, nodes, interval_s or None,
                            "fixed", restart_s, optimum)


def minutes(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds >= 3600 * 48:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min"


def percent(fraction: float) -> str:
    return f"{100 * fraction:.2f}%" if fraction < 0.1 else f"{100 * fraction:.1f}%"


def _round(x: float | None, digits: int = 1):
    return None if x is None else round(x, digits)
