"""One row of a preflight report, and how rows add up to a verdict.

Every check, node-level or collective, produces ``Check`` rows: what was measured, what was
expected, and the fix to try. The verdict is plain: any ``fail`` row fails preflight, and the
nodes named on failing rows are the ones the gate excludes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)
ALL_NODES = "*"  # a row about the whole allocation, not one node


@dataclass
class Check:
    node: str
    check: str
    status: str
    measured: str = ""
    expected: str = ""
    fix: str = ""
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Check":
        return cls(**{k: data.get(k, "" if k != "detail" else {}) for k in
                      ("node", "check", "status", "measured", "expected", "fix", "detail")})


def counts(rows: list[Check]) -> dict[str, int]:
    out = {s: 0 for s in STATUSES}
    for r in rows:
        out[r.status] = out.get(r.status, 0) + 1
    return out


def passed(rows: list[Check]) -> bool:
    return not any(r.status == FAIL for r in rows)


def bad_nodes(rows: list[Check]) -> list[str]:
    """Nodes named on failing rows (rows about the whole allocation name no node)."""
    bad = {r.node for r in rows if r.status == FAIL and r.node and r.node != ALL_NODES}
    for r in rows:  # collective rows may blame nodes they did not run on
        if r.status == FAIL:
            bad.update(r.detail.get("culprits", []))
    return sorted(bad)


def summary(rows: list[Check]) -> str:
    c = counts(rows)
    bad = bad_nodes(rows)
    head = "PASSED" if passed(rows) else "FAILED"
    text = f"{head}: {c[PASS]} pass, {c[WARN]} warn, {c[FAIL]} fail"
    if bad:
        text += f"; bad nodes: {', '.join(bad)}"
    elif not passed(rows):
        text += "; no single node to blame (see the failing rows)"
    return text
