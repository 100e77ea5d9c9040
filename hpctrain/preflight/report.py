"""The preflight report: one JSON document per run, and its table for people.

The JSON (``RUN/preflight/report-<attempt|timestamp>.json``) carries every row with what was
measured, what was expected and the fix; the table groups the rows by node, failing nodes
first, so the line to act on is at the top.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .results import ALL_NODES, FAIL, SKIP, WARN, Check, bad_nodes, counts, passed, summary

_ORDER = {FAIL: 0, WARN: 1, "pass": 2, SKIP: 3}


def build_report(rows: list[Check], **facts) -> dict:
    return {"passed": passed(rows), "bad_nodes": bad_nodes(rows), "summary": summary(rows),
            "counts": counts(rows), **facts, "checks": [r.to_dict() for r in rows]}


def report_name(attempt: int | None) -> str:
    return f"report-{attempt}.json" if attempt is not None else \
        f"report-{time.strftime('%Y%m%d-%H%M%S')}.json"


def write_json(path: Path, data: dict) -> Path:
    from ..config import yamlio
    path.parent.mkdir(parents=True, exist_ok=True)
    yamlio.write_atomic(path, json.dumps(data, indent=1, default=str))
    return path


def _size(b: float) -> str:
    return f"{b / 2**20:g} MB" if b >= 2**20 else f"{b / 2**10:g} KB"


def format_table(report: dict, show_skipped: bool = False) -> str:
    """The preflight report as a table. What it measured is text from the nodes (their names,
    the environment's NCCL variables, tools' output): the table goes through
    ``file_door.printable``, so none of it acts on the terminal."""
    from ..file_door import printable
    return printable(_format_table(report, show_skipped))


def _format_table(report: dict, show_skipped: bool = False) -> str:
    rows = [Check.from_dict(c) for c in report.get("checks", [])]
    if not show_skipped:
        rows = [r for r in rows if r.status != SKIP]
    by_node: dict[str, list[Check]] = {}
    for r in rows:
        by_node.setdefault(r.node, []).append(r)
    order = sorted(by_node, key=lambda n: (min(_ORDER.get(r.status, 9) for r in by_node[n]),
                                           n == ALL_NODES, n))
    width = max((len(r.check) for r in rows), default=10)
    out = []
    head = "PASSED" if report.get("passed") else "FAILED"
    where = f"profile {report.get('profile', '?')}"
    if report.get("nodes"):
        where += f", {len(report['nodes'])} node(s)"
    if report.get("world_size"):
        where += f", {report['world_size']} rank(s)"
    if report.get("duration_s") is not None:
        where += f", {report['duration_s']:.1f} s"
    out.append(f"Preflight {head} ({where})")
    for node in order:
        out.append("")
        out.append("all nodes" if node == ALL_NODES else node)
        for r in sorted(by_node[node], key=lambda r: _ORDER.get(r.status, 9)):
            line = f"  {r.status.upper():<4}  {r.check:<{width}}  {r.measured}"
            if r.expected and r.status in (FAIL, WARN):
                line += f"  (expected: {r.expected})"
            out.append(line)
            if r.fix and r.status in (FAIL, WARN):
                out.append(f"  {'':<4}  {'':<{width}}  fix: {r.fix}")
    sweep = report.get("sweep") or []
    if sweep:
        out.append("")
        out.append(f"All-reduce sweep over {report.get('world_size', '?')} ranks "
                   f"({report.get('backend', '?')}):")
        out.append(f"  {'size':>10}  {'time (us)':>10}  {'algbw (GB/s)':>12}  {'busbw (GB/s)':>12}")
        for s in sweep:
            out.append(f"  {_size(s['size']):>10}  {s['time_us']:>10.1f}  {s['algbw']:>12.3f}  "
                       f"{s['busbw']:>12.3f}")
    out.append("")
    out.append(report.get("summary", ""))
    if report.get("path"):
        out.append(f"Report: {report['path']}")
    return "\n".join(out)
