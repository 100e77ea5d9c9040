"""Which nodes are stragglers: ranks that compute slower than the others, interval after
interval.

At every ``train.log_interval`` the ranks all-gather one number each: the time their forward
passes took per step over the interval (``hpctrain.runtime.straggler_timing``). Not the step
time: in synchronous training every rank's step lasts as long as the slowest rank's, because
the others wait for it in the gradient reduction; the compute time is what differs. A node is
slow in an interval when one of its ranks took more than ``health.straggler_factor`` × the
median of all ranks, and it is *named* once it was slow ``health.straggler_window`` intervals in
a row. Every rank runs this on the same gathered numbers, so every rank reaches the same
decision without another collective.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass


@dataclass
class SlowNode:
    node: str
    ranks: list[int]
    ratio: float            # its slowest rank's compute time / the median of all ranks
    seconds: float          # its slowest rank's compute time per step
    median_s: float
    intervals: int          # slow this many intervals in a row

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        ranks = ", ".join(str(r) for r in self.ranks)
        return (f"{self.node} (rank{'s' if len(self.ranks) > 1 else ''} {ranks}: {self.ratio:.2f}× "
                f"the median compute time, {self.seconds * 1e3:.1f} vs {self.median_s * 1e3:.1f} "
                f"ms per step, {self.intervals} interval{'s' if self.intervals > 1 else ''} in a "
                f"row)")


class StragglerTracker:
    def __init__(self, factor: float, window: int) -> None:
        self.factor, self.window = factor, window
        self.streak: dict[str, int] = {}

    def assess(self, seconds: list[float], nodes: list[str]) -> tuple[list[SlowNode], list[SlowNode]]:
        """``seconds[r]``: rank r's compute time per step over the interval; ``nodes[r]`` its
        node. Returns (nodes slow in this interval, nodes named: slow ``window`` intervals in a
        row), each slowest first."""
        valid = [s for s in seconds if s is not None and s > 0]
        if len(valid) < 2:
            return [], []
        median = statistics.median(valid)
        slow: dict[str, list[int]] = {}
        for rank, (s, node) in enumerate(zip(seconds, nodes)):
            if s is not None and s > self.factor * median:
                slow.setdefault(node, []).append(rank)
        for node in set(nodes):
            self.streak[node] = self.streak.get(node, 0) + 1 if node in slow else 0
        found = []
        for node, ranks in slow.items():
            worst = max(seconds[r] for r in ranks)
            found.append(SlowNode(node=node, ranks=ranks, ratio=round(worst / median, 3),
                                  seconds=worst, median_s=median, intervals=self.streak[node]))
        found.sort(key=lambda n: -n.ratio)
        return found, [n for n in found if n.intervals >= self.window]
