"""Rank 0's plan for the collective rounds, and the rows each round adds.

Round 1 sweeps every size over the whole allocation. Round 2 runs each node alone (all its
ranks at once, every node in parallel) to find a node that is slow by itself. Then, with
three or more nodes (or two that missed the profile's bandwidth), pairs of nodes at the
largest size locate a node that is slow only when talking to others (:mod:`.locate`). A
round in which a group fails or hangs ends the checks: the process group cannot be trusted
after a timeout, and the hang row names who did not answer.
"""

from __future__ import annotations

from . import bandwidth_rows
from .bandwidth import threshold
from .locate import Locator
from .results import Check


class CollectiveRounds:
    def __init__(self, profile, roster: dict[int, str], sizes: list[int]):
        self.profile = profile
        self.roster = roster
        self.sizes = sizes
        self.nodes = sorted(set(roster.values()), key=lambda n: min(r for r, m in roster.items()
                                                                   if m == n))
        self.ranks_of = {n: sorted(r for r, m in roster.items() if m == n) for n in self.nodes}
        self.rows: list[Check] = []
        self.sweep: list[dict] = []
        self.failed = False
        self.locator: Locator | None = None
        self._world_ok = True
        self._intra_culprits: list[str] = []

    def _plan(self, label: str, node_groups: list[list[str]], sizes: list[int]) -> dict:
        groups = [sorted(r for n in g for r in self.ranks_of[n]) for g in node_groups]
        return {"label": label, "groups": groups, "node_groups": node_groups, "sizes": sizes}

    def first(self) -> dict:
        return self._plan("world", [self.nodes], self.sizes)

    def after(self, plan: dict, results: dict[int, dict]) -> dict | None:
        """Record a round's results; the next plan, or None when done."""
        stats = [bandwidth_rows.group_stats(g, plan["sizes"], results) for g in plan["groups"]]
        broken = [s for s in stats if not s["ok"]]
        label = plan["label"]
        if broken:
            merged = {"missing": sorted({r for s in broken for r in s["missing"]}),
                      "error": "; ".join(s["error"] for s in broken if s["error"])}
            name = {"world": "allreduce", "intra": "intra_node"}.get(label, "locate")
            self.rows.append(bandwidth_rows.hang_row(name, merged, self.roster,
                                            self.profile.preflight.timeout_s))
            self.failed = True
            return None
        if label == "world":
            self.sweep = stats[0]["rows"]
            row = bandwidth_rows.world_row(stats[0], self.profile, len(self.nodes), len(self.roster))
            self.rows.append(row)
            self._world_ok = row.status != "fail"
            if len(self.nodes) > 1 and max(len(r) for r in self.ranks_of.values()) > 1:
                return self._plan("intra", [[n] for n in self.nodes], self.sizes)
            return self._maybe_locate()
        if label == "intra":
            per_node = {g[0]: s for g, s in zip(plan["node_groups"], stats)}
            rows = bandwidth_rows.intra_rows(per_node, self.profile, self.profile.preflight.outlier_fraction)
            self.rows += rows
            self._intra_culprits = [r.node for r in rows if r.status == "fail"]
            return self._maybe_locate()
        # a locate round
        values = {tuple(g): bandwidth_rows.peak(s) for g, s in zip(plan["node_groups"], stats)}
        self.locator.record(values)
        return self._next_locate()

    def _maybe_locate(self) -> dict | None:
        candidates = [n for n in self.nodes if n not in self._intra_culprits]
        if len(candidates) >= 3 or (len(candidates) == 2 and not self._world_ok
                                    and not self._intra_culprits):
            self.locator = Locator(candidates, threshold(self.profile, True),
                                   self.profile.preflight.outlier_fraction)
            return self._next_locate()
        return None

    def _next_locate(self) -> dict | None:
        groups = self.locator.next_groups()
        if groups is None:
            self.rows.append(bandwidth_rows.locate_row(self.locator, len(self.nodes)))
            return None
        return self._plan("locate", groups, self.sizes[-1:])
