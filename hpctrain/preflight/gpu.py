"""GPU health from ``nvidia-smi --query-gpu ... --format=csv``.

Why: a node with a GPU missing, pending row remaps, uncorrected ECC errors or a hardware
slowdown clock reason runs the whole job at its pace (or crashes it hours in). The parser is
driven by the CSV header, so it reads any field subset and both ``csv`` and ``csv,nounits``;
the runner drops fields an older driver does not know and asks again.
"""

from __future__ import annotations

import csv
import io
import re

from .results import FAIL, PASS, SKIP, WARN, Check
from .tools import run_tool

QUERY_FIELDS = [
    "index", "name", "uuid", "pci.bus_id", "memory.total", "driver_version",
    "ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure",
    "clocks_throttle_reasons.active", "persistence_mode",
]
# Newer drivers call it clocks_event_reasons; older ones only know the throttle name.
RENAMED = {"clocks_throttle_reasons.active": "clocks_event_reasons.active"}

# NVML clock event reason bits that slow a healthy GPU down (idle 0x1, app clocks 0x2 are fine).
THROTTLE_BITS = {0x4: ("SW power cap", WARN), 0x8: ("HW slowdown", FAIL),
                 0x20: ("SW thermal slowdown", WARN), 0x40: ("HW thermal slowdown", FAIL),
                 0x80: ("HW power brake", FAIL)}
_UNSET = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


def _key(header: str) -> str:
    """'memory.total [MiB]' -> 'memory.total'."""
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", header.strip())


def parse_gpu_query(text: str, fields: list[str] | None = None) -> list[dict]:
    """Rows of ``nvidia-smi --query-gpu`` CSV as dicts keyed by field name.

    With a header line the keys come from it; for ``noheader`` output pass ``fields``.
    Values keep nvidia-smi's text, minus units; ``[N/A]``-like values become None.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    rows = list(reader)
    if fields is None:
        header, rows = [_key(h) for h in rows[0]], rows[1:]
    else:
        header = list(fields)
    out = []
    for row in rows:
        if len(row) != len(header):
            continue
        rec = {}
        for k, v in zip(header, row):
            v = v.strip()
            v = re.sub(r"\s*(MiB|W|MHz|%)$", "", v)
            rec[k] = None if v.lower() in _UNSET else v
        out.append(rec)
    return out


def _int(v) -> int | None:
    try:
        return int(str(v), 0) if v is not None else None
    except ValueError:
        try:
            return int(float(v))
        except (TypeError, ValueError):
            return None


def query_gpus(fields: list[str] | None = None, attempts: int = 4) -> tuple[list[dict] | None, str]:
    """Run nvidia-smi; returns (rows, problem). Unknown fields are dropped and asked again."""
    fields = list(fields or QUERY_FIELDS)
    last = ""
    for _ in range(attempts):
        res = run_tool(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv"])
        if res.ok:
            return parse_gpu_query(res.stdout), ""
        bad = _INVALID_FIELD.search(res.stdout + res.stderr)
        if res.missing or not bad or bad.group(1) not in fields:
            return None, res.problem()
        i = fields.index(bad.group(1))
        if bad.group(1) in RENAMED:
            fields[i] = RENAMED[bad.group(1)]
        else:
            fields.pop(i)
        last = res.problem()
    return None, last


def throttle_reasons(mask: int) -> list[tuple[str, str]]:
    return [(name, level) for bit, (name, level) in THROTTLE_BITS.items() if mask & bit]


def check_gpus(rows: list[dict] | None, problem: str, profile, node: str) -> list[Check]:
    """Rows of checks for one node's GPUs against the profile."""
    if profile.node.device != "cuda":
        return [Check(node, "gpu", SKIP, measured="cpu profile", expected="no GPUs")]
    if rows is None:
        return [Check(node, "gpu.count", FAIL, measured=problem, expected=f"{profile.node.gpus} GPUs",
                      fix="install/load the NVIDIA driver so nvidia-smi works on this node "
                          "(for a CPU rehearsal set node.device: cpu in the profile)")]
    out = []
    want = profile.slurm.gpus_per_node
    full = profile.node.gpus or want
    n = len(rows)
    if n < want:
        out.append(Check(node, "gpu.count", FAIL, f"{n} GPUs", f"{want} (slurm.gpus_per_node)",
                         "a GPU fell off the bus or is hidden: check `nvidia-smi -q`, dmesg for Xid "
                         "79, reset or drain the node"))
    elif n < full:
        level = FAIL if profile.slurm.exclusive else WARN
        out.append(Check(node, "gpu.count", level, f"{n} GPUs", f"{full} (node.gpus)",
                         "a GPU is missing from this node; drain it or lower node.gpus"))
    else:
        out.append(Check(node, "gpu.count", PASS, f"{n} GPUs", f"{full}"))
    model = profile.node.gpu_model
    if model:
        wrong = [f"GPU {r.get('index')}: {r.get('name')}" for r in rows
                 if model.lower() not in (r.get("name") or "").lower()]
        out.append(Check(node, "gpu.model", FAIL if wrong else PASS,
                         "; ".join(wrong) or (rows[0].get("name") or "?") if rows else "none",
                         model, "the allocation landed on the wrong GPU type: set "
                                "slurm.constraint or the partition" if wrong else ""))
    out += _health(rows, node)
    return out


def _health(rows: list[dict], node: str) -> list[Check]:
    out = []
    ecc_bad = [(r.get("index"), _int(r.get("ecc.errors.uncorrected.volatile.total"))) for r in rows]
    ecc_bad = [(i, c) for i, c in ecc_bad if c]
    if any("ecc.errors.uncorrected.volatile.total" in r for r in rows):
        out.append(Check(node, "gpu.ecc", FAIL if ecc_bad else PASS,
                         ", ".join(f"GPU {i}: {c} uncorrected" for i, c in ecc_bad) or "0 uncorrected",
                         "0 uncorrected ECC errors since driver load",
                         "drain the node and reset the GPU (nvidia-smi -r); replace it if errors return"
                         if ecc_bad else ""))
    off = [r.get("index") for r in rows if (r.get("ecc.mode.current") or "").lower() == "disabled"]
    if off:
        out.append(Check(node, "gpu.ecc_mode", WARN, f"ECC off on GPU {', '.join(off)}", "Enabled",
                         "enable ECC (nvidia-smi -e 1, then reboot) so memory errors are caught"))
    pending = [r.get("index") for r in rows if (r.get("retired_pages.pending") or "").lower() == "yes"
               or (r.get("remapped_rows.pending") or "").lower() == "yes"]
    failed = [r.get("index") for r in rows if (r.get("remapped_rows.failure") or "").lower() == "yes"]
    if any(k in r for r in rows for k in ("retired_pages.pending", "remapped_rows.pending")):
        if failed:
            out.append(Check(node, "gpu.memory_pages", FAIL, f"row remapping failed on GPU "
                             f"{', '.join(failed)}", "no failure", "the GPU needs replacement (RMA)"))
        elif pending:
            out.append(Check(node, "gpu.memory_pages", FAIL, f"page retirement/row remap pending on "
                             f"GPU {', '.join(pending)}", "nothing pending",
                             "reset the GPU or reboot the node to apply the pending remap"))
        else:
            out.append(Check(node, "gpu.memory_pages", PASS, "nothing pending", "nothing pending"))
    throttle_key = next((k for k in ("clocks_throttle_reasons.active", "clocks_event_reasons.active")
                         if any(k in r for r in rows)), None)
    if throttle_key:
        found, level = [], PASS
        for r in rows:
            mask = _int(r.get(throttle_key))
            for name, lvl in throttle_reasons(mask or 0):
                found.append(f"GPU {r.get('index')}: {name}")
                level = FAIL if FAIL in (lvl, level) else WARN
        out.append(Check(node, "gpu.clocks", level, "; ".join(found) or "no slowdown",
                         "no HW/thermal/power slowdown",
                         "check cooling and power of the listed GPUs (nvidia-smi -q -d PERFORMANCE)"
                         if found else ""))
    if any("persistence_mode" in r for r in rows):
        off = [r.get("index") for r in rows if (r.get("persistence_mode") or "").lower() == "disabled"]
        out.append(Check(node, "gpu.persistence", WARN if off else PASS,
                         f"off on GPU {', '.join(off)}" if off else "Enabled", "Enabled",
                         "run nvidia-persistenced (or nvidia-smi -pm 1) so jobs do not pay driver "
                         "start-up and clocks stay stable" if off else ""))
    return out
