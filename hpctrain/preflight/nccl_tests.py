"""Read nccl-tests ``all_reduce_perf`` output.

Why: nccl-tests is the reference users compare against. Parsing its table lets the test suite
prove :func:`hpctrain.preflight.bandwidth.busbw` computes exactly what nccl-tests prints, and
lets users paste a run's numbers next to preflight's.
"""

from __future__ import annotations

import re

_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+\s+)?([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                  r"\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")


def parse_all_reduce_perf(text: str) -> dict:
    """{'nranks': N, 'rows': [...], 'avg_busbw': x} from an all_reduce_perf log."""
    ranks = re.findall(r"^#\s+Rank\s+(\d+)", text, re.M)
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        rows.append({"size": int(m.group(1)), "count": int(m.group(2)), "type": m.group(3),
                     "redop": m.group(4), "time_us": float(m.group(6)), "algbw": float(m.group(7)),
                     "busbw": float(m.group(8)), "wrong": m.group(9),
                     "inplace_time_us": float(m.group(10)), "inplace_algbw": float(m.group(11)),
                     "inplace_busbw": float(m.group(12))})
    avg = re.search(r"# Avg bus bandwidth\s*:\s*([\d.]+)", text)
    return {"nranks": len(set(ranks)), "rows": rows, "avg_busbw": float(avg.group(1)) if avg else None}
