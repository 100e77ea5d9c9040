"""InfiniBand/RoCE ports from ``ibstat`` or, where it is missing, sysfs.

Why: one port that is Down, trained at 100 Gb/s on a 400 Gb/s link, or flapping
(``link_downed`` growing) makes every ring through that node slow, and NCCL says nothing.
The sysfs root is a parameter (and the test variable ``HPCTRAIN_TEST_SYSFS_IB``) so tests read
a fixture tree; counters are read twice, ``interval_s`` apart, to catch errors that are growing
now.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .. import fault_injection
from .results import FAIL, PASS, SKIP, WARN, Check
from .tools import run_tool

DEFAULT_SYSFS = "/sys/class/infiniband"
COUNTERS = ("link_downed", "symbol_error")


@dataclass
class IbPort:
    device: str
    port: int
    state: str = ""
    phys_state: str = ""
    rate_gbps: float | None = None
    link_layer: str = ""

    @property
    def active(self) -> bool:
        return self.state.lower() in ("active", "4: active")

    @property
    def link_up(self) -> bool:
        return "linkup" in self.phys_state.lower().replace(" ", "")


def _rate(text: str) -> float | None:
    m = re.search(r"(\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


def parse_ibstat(text: str) -> list[IbPort]:
    """Ports from ``ibstat`` output (``ibpanic`` lines for vanished devices are ignored)."""
    ports: list[IbPort] = []
    device, cur = None, None
    for line in text.splitlines():
        m = re.match(r"^CA '([^']+)'", line.strip())
        if m:
            device, cur = m.group(1), None
            continue
        m = re.match(r"^Port (\d+):", line.strip())
        if m and device:
            cur = IbPort(device, int(m.group(1)))
            ports.append(cur)
            continue
        if cur is None or ":" not in line:
            continue
        key, _, value = line.strip().partition(":")
        key, value = key.strip().lower(), value.strip()
        if key == "state":
            cur.state = value
        elif key == "physical state":
            cur.phys_state = value
        elif key == "rate":
            cur.rate_gbps = _rate(value)
        elif key == "link layer":
            cur.link_layer = value
    return ports


def _read(path: Path) -> str:
    return path.read_text().strip()


def _sysfs_state(text: str) -> str:
    """'4: ACTIVE' -> 'Active'; '5: LinkUp' -> 'LinkUp'."""
    value = text.split(":", 1)[-1].strip()
    return value.capitalize() if value.isupper() else value


def read_sysfs(root: str | os.PathLike | None = None) -> tuple[list[IbPort], dict, str]:
    """Ports and error counters from ``<root>/<dev>/ports/<n>/``; (ports, counters, problem)."""
    base = Path(root or fault_injection.value("HPCTRAIN_TEST_SYSFS_IB") or DEFAULT_SYSFS)
    ports, counters = [], {}
    try:
        devices = sorted(p for p in base.iterdir() if (p / "ports").is_dir())
    except OSError as e:
        return [], {}, f"cannot read {base}: {e.strerror or e}"
    for dev in devices:
        for pdir in sorted((dev / "ports").iterdir(), key=lambda p: p.name):
            if not pdir.name.isdigit():
                continue
            port = IbPort(dev.name, int(pdir.name))
            try:
                port.state = _sysfs_state(_read(pdir / "state"))
                port.phys_state = _sysfs_state(_read(pdir / "phys_state"))
                port.rate_gbps = _rate(_read(pdir / "rate"))
                port.link_layer = _read(pdir / "link_layer")
            except OSError:
                pass  # a half-readable port still counts as present
            ports.append(port)
            vals = {}
            for c in COUNTERS:
                try:
                    vals[c] = int(_read(pdir / "counters" / c))
                except (OSError, ValueError):
                    continue
            counters[(dev.name, port.port)] = vals
    return ports, counters, ""


def collect(root=None, interval_s: float = 2.0, sleep=time.sleep) -> dict:
    """Everything the IB check needs: ibstat (else sysfs) ports, counters read twice."""
    res = run_tool(["ibstat"])
    ports = parse_ibstat(res.stdout) if res.ok or (res.stdout and "CA '" in res.stdout) else None
    source = "ibstat"
    sys_ports, before, sys_problem = read_sysfs(root)
    if not ports:
        ports, source = (sys_ports if not sys_problem else None), "sysfs"
    after = {}
    if before and interval_s > 0:
        sleep(interval_s)
        _, after, _ = read_sysfs(root)
    problem = "" if ports is not None else f"{res.problem()}; {sys_problem}"
    return {"ports": ports, "source": source, "before": before, "after": after, "problem": problem}


def counter_growth(before: dict, after: dict) -> dict:
    """{(dev, port): {counter: increase}} for counters that grew between two reads."""
    grown = {}
    for key, vals in after.items():
        for name, v in vals.items():
            old = before.get(key, {}).get(name)
            if old is not None and v > old:
                grown.setdefault(key, {})[name] = v - old
    return grown


def check_infiniband(data: dict, profile, node: str) -> list[Check]:
    ic = profile.interconnect
    if ic.kind not in ("infiniband", "roce"):
        return [Check(node, "ib", SKIP, measured=f"interconnect.kind {ic.kind}")]
    ports = data.get("ports")
    if ports is None:
        return [Check(node, "ib.hcas", FAIL, data.get("problem", ""), ", ".join(ic.hcas),
                      "install infiniband-diags (ibstat) or make /sys/class/infiniband readable; "
                      "if the node has no HCA it cannot run this profile")]
    by_name: dict[str, list[IbPort]] = {}
    for p in ports:
        by_name.setdefault(p.device, []).append(p)
    out, missing, selected = [], [], []
    for h in ic.hcas:
        name, _, port = h.partition(":")
        found = [p for p in by_name.get(name, []) if not port or p.port == int(port)]
        (selected.extend(found) if found else missing.append(h))
    found_names = ", ".join(sorted(by_name)) or "none"
    out.append(Check(node, "ib.hcas", FAIL if missing else PASS,
                     f"missing {', '.join(missing)} (found: {found_names})" if missing
                     else f"{len(ic.hcas)} HCAs present ({data.get('source')})",
                     ", ".join(ic.hcas),
                     "fix interconnect.hcas to the names ibstat lists, or repair the HCA/driver on "
                     "this node" if missing else ""))
    down = [f"{p.device}:{p.port} {p.state}/{p.phys_state}" for p in selected
            if not (p.active and p.link_up)]
    out.append(Check(node, "ib.ports", FAIL if down else PASS, "; ".join(down) or
                     f"{len(selected)} ports Active/LinkUp", "Active/LinkUp",
                     "reseat or replace the cable/transceiver, check the switch port and the subnet "
                     "manager (Initializing = no SM); drain the node meanwhile" if down else ""))
    if ic.port_rate_gbps:
        slow = [f"{p.device}:{p.port} at {p.rate_gbps:g} Gb/s" for p in selected
                if p.rate_gbps is not None and p.rate_gbps < ic.port_rate_gbps]
        out.append(Check(node, "ib.rate", FAIL if slow else PASS, "; ".join(slow) or
                         f"{ic.port_rate_gbps:g} Gb/s on every port", f"{ic.port_rate_gbps:g} Gb/s",
                         "the link trained below its speed: replace the cable/transceiver or "
                         "check the switch port" if slow else ""))
    if ic.link_layer:
        wrong = [f"{p.device}:{p.port} is {p.link_layer}" for p in selected
                 if p.link_layer and p.link_layer.lower() != ic.link_layer.lower()]
        out.append(Check(node, "ib.link_layer", FAIL if wrong else PASS, "; ".join(wrong) or
                         ic.link_layer, ic.link_layer,
                         "these ports run the other link layer: fix interconnect.hcas/link_layer "
                         "or the port configuration (mlxconfig LINK_TYPE)" if wrong else ""))
    out.append(_counters(data, selected, node))
    return out


def _counters(data: dict, selected: list[IbPort], node: str) -> Check:
    if not data.get("after"):
        return Check(node, "ib.counters", WARN if not data.get("before") else SKIP,
                     "error counters not readable" if not data.get("before") else "read once",
                     "no growth", "make /sys/class/infiniband/*/ports/*/counters readable"
                     if not data.get("before") else "")
    wanted = {(p.device, p.port) for p in selected}
    grown = {k: v for k, v in counter_growth(data["before"], data["after"]).items() if k in wanted}
    if not grown:
        return Check(node, "ib.counters", PASS, "no growth", "no growth")
    text = "; ".join(f"{d}:{p} " + ", ".join(f"{c} +{n}" for c, n in v.items())
                     for (d, p), v in sorted(grown.items()))
    flapping = any("link_downed" in v for v in grown.values())
    return Check(node, "ib.counters", FAIL if flapping else WARN, text, "no growth",
                 "the link is flapping: replace the cable/transceiver and drain the node" if flapping
                 else "symbol errors are growing: clean or replace the cable before it fails",
                 detail={"grown": {f"{d}:{p}": v for (d, p), v in grown.items()}})
