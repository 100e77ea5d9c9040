"""Which node makes the collective slow: pair the nodes up, then cross-check the suspects.

Why: a full-allocation all-reduce only says "slow". Round 1 runs every disjoint pair of nodes
at once; nodes in healthy pairs are cleared. Round 2+ pairs each suspect with a different
cleared node, so a slow result convicts the suspect alone. When every pair is slow the fault
is not one node (fabric, switch, configuration) and nobody is blamed. Pure logic: the caller
measures the groups it is handed and reports back their bus bandwidth (None = failed).
"""

from __future__ import annotations


def pair_up(nodes: list[str]) -> list[list[str]]:
    """Disjoint pairs; an odd node out joins the last pair."""
    groups = [list(nodes[i:i + 2]) for i in range(0, len(nodes), 2)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2].append(groups.pop()[0])
    return groups


def slow_groups(results: dict[tuple, float | None], floor: float | None,
                outlier_fraction: float, reference: float | None = None) -> set[tuple]:
    """Groups that failed, fell below ``floor``, or below ``outlier_fraction`` of the best."""
    values = [v for v in results.values() if v]
    best = max(values + ([reference] if reference else []), default=None)
    bad = set()
    for key, v in results.items():
        if v is None or (floor and v < floor) or \
                (best and (len(results) > 1 or reference) and v < outlier_fraction * best):
            bad.add(key)
    return bad


class Locator:
    """Drive it with ``next_groups()`` / ``record()`` until ``next_groups()`` returns None."""

    def __init__(self, nodes: list[str], floor: float | None, outlier_fraction: float):
        self.nodes = list(nodes)
        self.floor = floor
        self.outlier_fraction = outlier_fraction
        self.culprits: list[str] = []
        self.cleared: list[str] = []
        self.note = ""
        self.rounds: list[dict] = []
        self._stage = "pairs" if len(nodes) >= 2 else "done"
        self._suspects: list[str] = []
        self._reference: float | None = None
        self._pending: list[list[str]] | None = None

    def next_groups(self) -> list[list[str]] | None:
        if self._stage == "pairs":
            self._pending = pair_up(self.nodes)
        elif self._stage == "cross" and self._suspects:
            self._pending = [[s, g] for s, g in zip(self._suspects, self.cleared)]
        else:
            self._stage = "done"
            self._pending = None
        return self._pending

    def record(self, results: dict[tuple, float | None]) -> None:
        groups = self._pending or []
        self.rounds.append({"stage": self._stage, "groups": [list(g) for g in groups],
                            "busbw": [results.get(tuple(g)) for g in groups]})
        if self._stage == "pairs":
            bad = slow_groups(results, self.floor, self.outlier_fraction)
            for g in groups:
                (self._suspects if tuple(g) in bad else self.cleared).extend(g)
            good = [v for k, v in results.items() if k not in bad and v]
            self._reference = max(good) if good else None
            if not self._suspects:
                self.note = "every pair of nodes is fast; the slowdown needs the full allocation " \
                            "(switch or fabric congestion)"
                self._stage = "done"
            elif not self.cleared:
                self.note = ("both nodes are slow together; with two nodes the culprit cannot be "
                             "told apart by pairing" if len(self.nodes) == 2 else
                             "every pair of nodes is slow: a fabric or configuration problem, "
                             "not one node")
                self._stage = "done"
            else:
                self._stage = "cross"
            return
        bad = slow_groups(results, self.floor, self.outlier_fraction, reference=self._reference)
        tested = [s for s, _ in groups]
        for s, g in groups:
            (self.culprits if (s, g) in bad else self.cleared).append(s)
        self._suspects = [s for s in self._suspects if s not in tested]
        if not self._suspects:
            self._stage = "done"
