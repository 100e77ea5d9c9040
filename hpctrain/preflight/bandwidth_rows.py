"""Turning per-rank timings into bandwidth rows (rank 0's side of the collective checks).

Pure: it never touches torch. Each rank reports one all-reduce's time per size (the median
of the timed iterations on GPUs, the fastest on the CPU);
a group's time is its slowest member's (the collective finishes when the last rank does, as
in nccl-tests), and bandwidth follows :mod:`.bandwidth`. A failed or hung group names the
ranks that never arrived at the collective, and their nodes.
"""

from __future__ import annotations

from .bandwidth import algbw, busbw, expected_busbw, threshold
from .results import ALL_NODES, FAIL, PASS, WARN, Check


def group_stats(group: list[int], sizes: list[int], results: dict[int, dict]) -> dict:
    """{'ok': bool, 'rows': [{size, time_us, algbw, busbw}], 'missing': [...], 'error': str}."""
    missing = sorted({r for r in group if r not in results})
    failed = [results[r] for r in group if r in results and results[r].get("status") != "ok"]
    if missing or failed:
        blamed = set(missing)
        for f in failed:
            blamed.update(f.get("missing", []))
        errors = sorted({f.get("error", "") for f in failed if f.get("error")})
        return {"ok": False, "rows": [], "missing": sorted(blamed), "silent": missing,
                "error": "; ".join(errors)[:300]}
    rows = []
    for i, size in enumerate(sizes):
        t = max(results[r]["times"][i] for r in group)
        a = algbw(size, t)
        rows.append({"size": size, "time_us": t * 1e6, "algbw": a, "busbw": busbw(a, len(group))})
    return {"ok": True, "rows": rows, "missing": [], "silent": [], "error": ""}


def peak(stats: dict) -> float | None:
    """Bus bandwidth at the largest size (where a sweep reaches its plateau)."""
    return stats["rows"][-1]["busbw"] if stats.get("ok") and stats["rows"] else None


def _fmt_size(b: int) -> str:
    return f"{b / 2**20:g} MB" if b >= 2**20 else f"{b / 2**10:g} KB"


def describe(stats: dict) -> str:
    r = stats["rows"]
    text = f"busbw {r[-1]['busbw']:.2f} GB/s at {_fmt_size(r[-1]['size'])}"
    if len(r) > 1:
        text += f"; {r[0]['time_us']:.0f} us at {_fmt_size(r[0]['size'])}"
    return text


def expectation(profile, inter_node: bool) -> str:
    floor = threshold(profile, inter_node)
    if floor is None:
        key = "inter_node_busbw_gbs" if inter_node else "intra_node_busbw_gbs"
        return f"not set (interconnect.{key})"
    return (f">= {floor:.1f} GB/s ({profile.interconnect.min_bandwidth_fraction:g} x "
            f"{expected_busbw(profile, inter_node):g})")


def hang_row(label: str, stats: dict, nodes_of: dict[int, str], timeout_s: int) -> Check:
    blamed = stats["missing"]
    nodes = sorted({nodes_of.get(r, "?") for r in blamed})
    if blamed:
        who = ", ".join(f"rank {r} ({nodes_of.get(r, '?')})" for r in blamed)
        measured = f"no answer within {timeout_s} s from {who}"
        fix = ("those ranks never reached the all-reduce: check their logs and the nodes "
               f"{', '.join(nodes)} (GPU hang, dead process, network); exclude them and retry")
    else:
        measured = f"the all-reduce failed: {stats['error'] or 'no rank reported back'}"
        fix = "every rank arrived but the collective did not complete: check the fabric between " \
              "these nodes (NCCL_DEBUG=INFO), then retry"
    return Check(ALL_NODES, f"collective.{label}", FAIL, measured, f"completes within {timeout_s} s",
                 fix, detail={"culprits": nodes, "ranks": blamed, "error": stats["error"]})


def world_row(stats: dict, profile, nodes: int, ranks: int = 2) -> Check:
    if ranks == 1:   # busbw = algbw x 2(n-1)/n is 0: the group formed, nothing to measure
        r = stats["rows"]
        return Check(ALL_NODES, "collective.allreduce", PASS,
                     f"1 rank: the process group formed and the all-reduce completed "
                     f"({r[0]['time_us']:.0f} us at {_fmt_size(r[0]['size'])}); no bandwidth "
                     f"between GPUs to measure", "completes", detail={"sweep": r})
    inter = nodes > 1
    floor = threshold(profile, inter)
    value = peak(stats)
    level = FAIL if floor and value is not None and value < floor else PASS
    fix = ""
    if level == FAIL:
        fix = ("the allocation is slower than the profile expects; see the per-node and pair rows "
               "for the culprit, and nccl.transport for a socket fallback")
    return Check(ALL_NODES, "collective.allreduce", level, describe(stats),
                 expectation(profile, inter), fix, detail={"sweep": stats["rows"]})


def intra_rows(per_node: dict[str, dict], profile, outlier_fraction: float) -> list[Check]:
    """One row per node for the all-reduce among its own ranks."""
    floor = threshold(profile, False)
    values = {n: peak(s) for n, s in per_node.items()}
    best = max((v for v in values.values() if v), default=None)
    rows = []
    for node, stats in sorted(per_node.items()):
        v = values[node]
        if v is None:
            continue
        slow_abs = floor is not None and v < floor
        slow_rel = best is not None and len(values) > 1 and v < outlier_fraction * best
        level = FAIL if (slow_abs or slow_rel) else PASS
        expected = expectation(profile, False)
        if slow_rel and best:
            expected += f"; best node {best:.2f} GB/s"
        fix = ("this node is slow on its own: check its GPUs (clocks, NVLink), CPU load and "
               "other jobs on it; exclude it" if level == FAIL else "")
        rows.append(Check(node, "collective.intra_node", level, describe(stats), expected, fix,
                          detail={"sweep": stats["rows"]}))
    return rows


def locate_row(locator, nodes: int) -> Check:
    detail = {"rounds": locator.rounds, "culprits": list(locator.culprits)}
    if locator.culprits:
        return Check(ALL_NODES, "collective.locate", FAIL,
                     f"slow with every partner: {', '.join(locator.culprits)}",
                     "no node slower than its partners",
                     f"exclude {', '.join(locator.culprits)} (--exclude) and check their HCAs, "
                     "cables and switch ports", detail=detail)
    level = WARN if locator.note and "slow" in locator.note else PASS
    return Check(ALL_NODES, "collective.locate", level,
                 locator.note or f"all {nodes} nodes fast in pairs", "no slow node",
                 "" if level == PASS else "check the fabric and the NCCL settings shared by all "
                 "nodes", detail=detail)
