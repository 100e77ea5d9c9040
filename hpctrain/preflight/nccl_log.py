"""Which transport NCCL really chose, read from its ``NCCL_DEBUG=INFO`` log.

Why: NCCL falls back from InfiniBand to TCP sockets without an error (a missing plugin, a
wrong ``NCCL_IB_HCA``, a container without ``/dev/infiniband``); the job runs 5x slower and
nobody notices. The log says it plainly: ``Using network IB`` vs ``Using network Socket``, and
per channel ``via NET/IB/0/GDRDMA``, ``via NET/Socket/0``, ``via P2P/IPC``, ``via SHM``.
Older NCCL versions (2.4, 2.5) print no ``Using network`` line: they only announce the
fallback as ``NET/IB : No device found.`` followed by ``NET/Socket : Using [0]eth0:...``,
and a rank whose ring neighbours are on its own node logs no ``NET/`` channel at all.
"""

from __future__ import annotations

import re
from collections import Counter

from .results import FAIL, PASS, SKIP, WARN, Check

_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
_VIA = re.compile(r"\bvia (NET/[A-Za-z]+(?:/\d+)?(?:/GDRDMA)?|P2P/\w+|SHM(?:/\w+)*|"
                  r"direct shared memory|P2P|COLLNET\w*)")
_NET_IB_USING = re.compile(r"NET/IB : Using (.*?)(?:; OOB|$)")
_NET_SOCKET_USING = re.compile(r"NET/Socket : Using ")
_VERSION = re.compile(r"NCCL version (\S+)")


def parse_nccl_transport(text: str) -> dict:
    """Summary of a NCCL INFO log: networks named, channel transports counted, GDR use."""
    networks = Counter(m.group(1) for m in _NETWORK.finditer(text))
    via = Counter()
    gdr = 0
    for m in _VIA.finditer(text):
        kind = m.group(1)
        if kind.startswith("NET/"):
            gdr += kind.endswith("/GDRDMA")
            kind = "NET/" + kind.split("/")[1]
        elif kind.startswith("SHM") or kind == "direct shared memory":
            kind = "SHM"
        via[kind] += 1
    hcas = sorted({h for m in _NET_IB_USING.finditer(text)
                   for h in re.findall(r"\]([^\s:\]]+):\d+", m.group(1))})
    version = _VERSION.search(text)
    return {"networks": dict(networks), "via": dict(via), "gdr_channels": gdr, "ib_hcas": hcas,
            "no_ib_device": "NET/IB : No device found" in text,
            "socket_announced": bool(_NET_SOCKET_USING.search(text)),
            "version": version.group(1) if version else None}


def check_transport(summary: dict | None, profile, node: str, nodes: int) -> Check:
    if profile.node.device != "cuda":
        return Check(node, "nccl.transport", SKIP, "gloo (cpu profile)", "")
    # older NCCL: no "Using network" line; the socket transport is only announced
    announced_socket = bool(summary and not summary["networks"] and summary["no_ib_device"]
                            and summary.get("socket_announced"))
    if not summary or not (summary["networks"] or summary["via"] or announced_socket):
        return Check(node, "nccl.transport", WARN, "no NCCL INFO lines found", "NET/IB",
                     "NCCL_DEBUG_FILE was not honoured; rerun with NCCL_DEBUG=INFO to see the transport")
    ib = profile.interconnect.kind in ("infiniband", "roce")
    via = summary["via"]
    net = ", ".join(summary["networks"]) or ("Socket (announced: NET/Socket : Using)"
                                             if announced_socket else "-")
    measured = f"network {net}; channels " + (", ".join(f"{k} x{v}" for k, v in sorted(via.items()))
                                                or "none")
    if ib and (via.get("NET/Socket") or "Socket" in summary["networks"] or announced_socket):
        why = " (NCCL found no IB device)" if summary["no_ib_device"] else ""
        return Check(node, "nccl.transport", FAIL, measured + why, "NET/IB",
                     "NCCL fell back to TCP sockets: check NCCL_IB_HCA, that /dev/infiniband is in "
                     "the container, and the NCCL net plugin; compare `ibstat` on this node",
                     detail=summary)
    if ib and nodes > 1 and not via.get("NET/IB"):
        return Check(node, "nccl.transport", WARN, measured, "NET/IB between nodes",
                     "no inter-node channel was logged; rerun with NCCL_DEBUG_SUBSYS=INIT,NET",
                     detail=summary)
    if ib and via.get("NET/IB") and not summary["gdr_channels"]:
        return Check(node, "nccl.transport", WARN, measured + " without GPUDirect RDMA", "NET/IB/GDRDMA",
                     "load nvidia-peermem (or use DMA-BUF) so NICs read GPU memory directly",
                     detail=summary)
    return Check(node, "nccl.transport", PASS, measured, "NET/IB" if ib else "any", detail=summary)
