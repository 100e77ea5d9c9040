"""Software versions per node, and whether the nodes agree.

Why: one node with another NCCL, CUDA or driver build can hang or corrupt collectives, and a
megatron-core other than the validated one trains silently wrong. Versions come from package
metadata and ``nvidia-smi`` (no torch import) unless the caller already has torch loaded.
"""

from __future__ import annotations

import platform
import re
import sys
from collections import Counter
from importlib import metadata

from .. import __version__
from .results import ALL_NODES, FAIL, PASS, WARN, Check
from .tools import run_tool

# what must match across nodes, and how badly a mismatch hurts
MUST_MATCH = {"torch": FAIL, "nccl": FAIL, "cuda": FAIL, "megatron-core": FAIL, "hpctrain": FAIL,
              "python": WARN, "driver": WARN}


def _pkg(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def parse_smi_banner(text: str) -> dict:
    """Driver and CUDA versions from the ``nvidia-smi`` banner."""
    out = {}
    m = re.search(r"Driver Version:\s*([\d.]+)", text)
    if m:
        out["driver"] = m.group(1)
    m = re.search(r"CUDA Version:\s*([\d.]+)", text)
    if m:
        out["driver_cuda"] = m.group(1)
    return out


def local_versions(with_torch: bool = False) -> dict:
    v = {"python": platform.python_version(), "hpctrain": __version__,
         "torch": _pkg("torch"), "megatron-core": _pkg("megatron-core")}
    nccl_pkg = next((p for p in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
                     if _pkg(p)), None)
    if nccl_pkg:
        v["nccl"] = _pkg(nccl_pkg)
    if with_torch or "torch" in sys.modules:
        import torch
        v["torch"] = torch.__version__
        v["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            try:
                v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # torch built without NCCL
                pass
    res = run_tool(["nvidia-smi"], timeout=20)
    if res.ok:
        v.update(parse_smi_banner(res.stdout))
    return {k: val for k, val in v.items() if val}


def check_versions_local(versions: dict, node: str) -> list[Check]:
    from ..runtime.versions import MEGATRON_CORE_VERSION
    mc = versions.get("megatron-core")
    if mc == MEGATRON_CORE_VERSION:
        return [Check(node, "software.megatron", PASS, mc, MEGATRON_CORE_VERSION)]
    return [Check(node, "software.megatron", FAIL, mc or "not installed", MEGATRON_CORE_VERSION,
                  f"pip install megatron-core=={MEGATRON_CORE_VERSION} (hpctrain relies on its "
                  "internals)")]


def compare_versions(per_node: dict[str, dict]) -> list[Check]:
    """One row per component; nodes that differ from the majority are named and blamed."""
    rows = []
    if len(per_node) < 2:
        return rows
    for name, level in MUST_MATCH.items():
        seen = {node: v.get(name) for node, v in per_node.items() if v.get(name)}
        if not seen:
            continue
        common, _ = Counter(seen.values()).most_common(1)[0]
        odd = sorted(n for n, v in seen.items() if v != common)
        if not odd:
            rows.append(Check(ALL_NODES, f"software.{name}", PASS, common, "same on every node"))
            continue
        rows.append(Check(ALL_NODES, f"software.{name}", level,
                          "; ".join(f"{n}: {seen[n]}" for n in odd), f"{common} (most nodes)",
                          f"install {name} {common} on {', '.join(odd)} (or rebuild the container)",
                          detail={"culprits": odd if level == FAIL else []}))
    return rows
