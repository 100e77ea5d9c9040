"""The NCCL environment a job will run with, checked against the node and the profile.

Why: a typo in ``NCCL_IB_HCA`` or ``NCCL_SOCKET_IFNAME`` does not fail anything; NCCL quietly
falls back to sockets or the wrong NIC and the run is 5x slower. The spec syntax follows
NCCL's documentation: comma-separated names, ``^`` excludes, ``=`` asks for exact names
(otherwise a name is a prefix), and ``NCCL_IB_HCA`` entries may carry a ``:port``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .. import fault_injection
from .results import FAIL, PASS, SKIP, WARN, Check

GDR_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")
DEFAULT_NET_ROOT = "/sys/class/net"


@dataclass
class Spec:
    exclude: bool
    exact: bool
    entries: list[tuple[str, int | None]]

    def matches(self, name: str, entry: str) -> bool:
        return name == entry if self.exact else name.startswith(entry)


def parse_spec(value: str, ports: bool = False) -> Spec:
    """Parse an ``NCCL_IB_HCA``/``NCCL_SOCKET_IFNAME`` value (``^=mlx5_0:1,mlx5_1``)."""
    v = value.strip()
    exclude = v.startswith("^")
    v = v[1:] if exclude else v
    exact = v.startswith("=")
    v = v[1:] if exact else v
    entries = []
    for item in filter(None, (x.strip() for x in v.split(","))):
        name, _, port = item.partition(":") if ports else (item, "", "")
        entries.append((name, int(port) if port.isdigit() else None))
    return Spec(exclude, exact, entries)


def list_interfaces(root: str | None = None) -> list[str]:
    base = Path(root or fault_injection.value("HPCTRAIN_TEST_SYSFS_NET") or DEFAULT_NET_ROOT)
    try:
        return sorted(p.name for p in base.iterdir())
    except OSError:
        return sorted(name for _, name in socket.if_nameindex())


def effective_env(profile, environ=None) -> dict:
    """What a rank sees: this environment with the profile's ``env`` exported over it."""
    env = dict(os.environ if environ is None else environ)
    env.update({k: str(v) for k, v in (profile.env or {}).items()})
    return env


def check_ib_hca(value: str | None, devices: dict[str, set[int]] | None, profile, node: str) -> Check:
    ib = profile.interconnect.kind in ("infiniband", "roce")
    if not value:
        return Check(node, "nccl.ib_hca", PASS if ib else SKIP, "not set (NCCL uses every HCA)",
                     "unset or naming existing HCAs")
    spec = parse_spec(value, ports=True)
    if devices is None:
        return Check(node, "nccl.ib_hca", WARN, f"NCCL_IB_HCA={value}; HCAs unknown here",
                     "names of existing HCAs", "run preflight where ibstat or sysfs shows the HCAs")
    bad = []
    for name, port in spec.entries:
        hits = [d for d in devices if spec.matches(d, name)]
        if not hits:
            bad.append(f"{name} matches no HCA")
        elif port is not None and not any(port in devices[d] for d in hits):
            bad.append(f"{name}:{port} has no port {port}")
    chosen = [d for d in devices if any(spec.matches(d, n) for n, _ in spec.entries) != spec.exclude]
    if bad:
        level = WARN if spec.exclude else FAIL
        return Check(node, "nccl.ib_hca", level, f"NCCL_IB_HCA={value}: {'; '.join(bad)}",
                     f"existing HCAs: {', '.join(sorted(devices)) or 'none'}",
                     "fix the names in the profile's env.NCCL_IB_HCA (a wrong name silently drops "
                     "that NIC, or all of them)")
    if ib and not chosen:
        return Check(node, "nccl.ib_hca", FAIL, f"NCCL_IB_HCA={value} selects no HCA",
                     "at least one HCA", "NCCL would fall back to sockets: fix env.NCCL_IB_HCA")
    return Check(node, "nccl.ib_hca", PASS, f"selects {', '.join(sorted(chosen))}",
                 "names of existing HCAs")


def check_socket_ifname(value: str | None, interfaces: list[str], profile, nodes: int,
                        node: str) -> Check:
    wanted = value or profile.interconnect.socket_ifname
    if not wanted:
        return Check(node, "nccl.socket_ifname", PASS, "not set (NCCL picks an interface)",
                     "unset or an existing interface")
    spec = parse_spec(wanted)
    names = [n for n, _ in spec.entries]
    if not value:
        return Check(node, "nccl.socket_ifname", WARN, "NCCL_SOCKET_IFNAME not exported",
                     f"{wanted} (interconnect.socket_ifname)",
                     f"add NCCL_SOCKET_IFNAME: {wanted} to the profile's env")
    if not spec.exclude and nodes > 1 and all(n == "lo" for n in names):
        return Check(node, "nccl.socket_ifname", FAIL, f"NCCL_SOCKET_IFNAME={value}",
                     "a routable interface", "`lo` cannot reach other nodes: name the cluster "
                     "network interface (ip -br addr)")
    missing = [n for n in names if not any(spec.matches(i, n) for i in interfaces)]
    if missing and not spec.exclude:
        return Check(node, "nccl.socket_ifname", FAIL, f"no interface {', '.join(missing)} "
                     f"(have: {', '.join(interfaces) or 'none'})", f"NCCL_SOCKET_IFNAME={value}",
                     "fix env.NCCL_SOCKET_IFNAME to an interface that exists on every node")
    return Check(node, "nccl.socket_ifname", PASS, f"NCCL_SOCKET_IFNAME={value}", "existing interface")


def check_disable(env: dict, profile, node: str) -> Check:
    ib = profile.interconnect.kind in ("infiniband", "roce")
    if ib and env.get("NCCL_IB_DISABLE", "").strip() in ("1", "true", "True"):
        return Check(node, "nccl.ib_disable", FAIL, "NCCL_IB_DISABLE=1",
                     f"IB enabled ({profile.interconnect.kind} profile)",
                     "remove NCCL_IB_DISABLE: it forces NCCL onto TCP sockets")
    if ib and env.get("NCCL_NET", "").lower() == "socket":
        return Check(node, "nccl.ib_disable", FAIL, "NCCL_NET=Socket", "IB",
                     "remove NCCL_NET=Socket: it forces NCCL onto TCP sockets")
    return Check(node, "nccl.ib_disable", PASS if ib else SKIP, "IB not disabled", "IB enabled")


def footguns(env: dict, nodes: int) -> list[str]:
    """Settings that work but cost performance or hide problems, one line each with the fix."""
    out = []
    if env.get("NCCL_P2P_DISABLE", "") in ("1", "true"):
        out.append("NCCL_P2P_DISABLE=1 turns NVLink/PCIe peer copies off: remove it")
    if env.get("NCCL_SHM_DISABLE", "") in ("1", "true"):
        out.append("NCCL_SHM_DISABLE=1 turns shared-memory transport off: remove it")
    gdr = env.get("NCCL_NET_GDR_LEVEL")
    if gdr is not None:
        g = gdr.strip().upper()
        # a level NCCL reads as a number: ASCII digits ("²" and "٣" are digits to str.isdigit,
        # not to NCCL; thousands of them would pass Python's int() digit limit)
        level = int(g) if g.isascii() and g.isdigit() and len(g) <= 9 else None
        if g == "LOC" or level == 0:
            out.append(f"NCCL_NET_GDR_LEVEL={gdr} disables GPUDirect RDMA: remove it or use PXB/SYS")
        elif g not in GDR_LEVELS and not (level is not None and level <= 5):
            out.append(f"NCCL_NET_GDR_LEVEL={gdr} is not one of {'/'.join(GDR_LEVELS)}: NCCL ignores "
                       "it")
        elif level is not None:
            out.append(f"NCCL_NET_GDR_LEVEL={gdr}: numeric levels are deprecated, use "
                       f"{'/'.join(GDR_LEVELS)}")
    if env.get("NCCL_DEBUG", "").upper() == "TRACE":
        out.append("NCCL_DEBUG=TRACE slows every collective and floods the logs: use WARN (INFO to "
                   "debug)")
    for k in ("NCCL_ALGO", "NCCL_PROTO"):
        if env.get(k):
            out.append(f"{k}={env[k]} overrides NCCL's tuning: remove it unless measured faster")
    return out


def check_nccl_env(env: dict, profile, devices: dict[str, set[int]] | None,
                   interfaces: list[str], nodes: int, node: str) -> list[Check]:
    if profile.node.device != "cuda":
        return [Check(node, "nccl.env", SKIP, measured="cpu profile (gloo)")]
    rows = [check_ib_hca(env.get("NCCL_IB_HCA"), devices, profile, node),
            check_socket_ifname(env.get("NCCL_SOCKET_IFNAME"), interfaces, profile, nodes, node),
            check_disable(env, profile, node)]
    warnings = footguns(env, nodes)
    rows.append(Check(node, "nccl.settings", WARN if warnings else PASS,
                      "; ".join(warnings) or "no known foot-guns", "no known foot-guns",
                      "edit the profile's env as each item says" if warnings else ""))
    return rows
