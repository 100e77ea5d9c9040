"""GPU↔GPU and GPU↔NIC topology from ``nvidia-smi topo -m``.

Why: one GPU whose NVLinks are down (or an NVSwitch node whose fabric manager did not start)
drags every tensor-parallel all-reduce onto PCIe; a GPU whose closest HCA sits across the CPU
interconnect halves its GPUDirect RDMA bandwidth. Both are visible in the matrix before any
byte is sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .results import FAIL, PASS, SKIP, WARN, Check
from .tools import run_tool

# closeness of a connection, best first (nvidia-smi's legend)
RANK = {
    "X": 0,         # a device with itself
    "NV": 1,        # NVLink
    "PIX": 2,       # one PCIe switch
    "PXB": 3,       # several PCIe switches, not the host bridge
    "PHB": 4,       # the host bridge (the CPU)
    "NODE": 5,      # between host bridges of one NUMA node
    "SYS": 6,       # across the CPUs' interconnect
}
_DEVICE = re.compile(r"^(GPU\d+|NIC\d+|mlx\w+|[a-z]+\d*_\w+)$")
# More than PCIe Gen5 x16 can carry: a profile expecting this inside a node expects NVLink.
PCIE_BUSBW_CEILING_GBS = 60.0


@dataclass
class Topology:
    devices: list[str]
    links: dict[tuple[str, str], str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0
    cpu_affinity: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not d.startswith("GPU")]

    def nic_name(self, col: str) -> str:
        return self.nic_names.get(col, col)


def link_kind(link: str) -> str:
    """'NV18' -> 'NV'; 'PIX' -> 'PIX'."""
    return "NV" if link.startswith("NV") else link


# nvidia-smi underlines the header even into a pipe (ESC[4m ... ESC[0m)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def parse_topo_matrix(text: str) -> Topology:
    text = _ANSI.sub("", text)
    lines = [ln.rstrip() for ln in text.replace("\t", "    ").splitlines()]
    header = next((ln for ln in lines if re.match(r"^\s+GPU0\b", ln)), None)
    if header is None:
        raise ValueError("no `GPU0 GPU1 ...` header line: not `nvidia-smi topo -m` output")
    devices = []
    for tok in header.split():
        if not _DEVICE.match(tok):
            break
        devices.append(tok)
    topo = Topology(devices=devices)
    for ln in lines:
        parts = ln.split()
        if not parts or parts[0] not in devices or ln[:1].isspace():
            continue
        row, cells = parts[0], parts[1:1 + len(devices)]
        for col, cell in zip(devices, cells):
            topo.links[(row, col)] = cell
        if len(parts) > 1 + len(devices):
            topo.cpu_affinity[row] = parts[1 + len(devices)]
    for m in re.finditer(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, re.M):
        topo.nic_names[m.group(1)] = m.group(2)
    return topo


def read_topology() -> tuple[Topology | None, str]:
    res = run_tool(["nvidia-smi", "topo", "-m"])
    if not res.ok:
        return None, res.problem()
    try:
        return parse_topo_matrix(res.stdout), ""
    except ValueError as e:
        return None, str(e)


def check_topology(topo: Topology | None, problem: str, profile, node: str) -> list[Check]:
    if profile.node.device != "cuda":
        return [Check(node, "topology", SKIP, measured="cpu profile")]
    if topo is None:
        return [Check(node, "topology", WARN, measured=problem, expected="nvidia-smi topo -m",
                      fix="make nvidia-smi available on the node to check NVLink and NIC placement")]
    return [_nvlink(topo, profile, node), *_nic_affinity(topo, profile, node)]


def _nvlink(topo: Topology, profile, node: str) -> Check:
    gpus = topo.gpus
    pairs = [(a, b, topo.links.get((a, b), "?")) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    if not pairs:
        return Check(node, "topology.nvlink", SKIP, measured=f"{len(gpus)} GPU")
    nv = [p for p in pairs if p[2].startswith("NV")]
    widest = max((int(p[2][2:] or 0) for p in nv), default=0)
    want_nvlink = (profile.interconnect.intra_node_busbw_gbs or 0) > PCIE_BUSBW_CEILING_GBS
    if not nv:
        if want_nvlink:
            return Check(node, "topology.nvlink", FAIL, "no NVLink between any GPU pair "
                         f"({pairs[0][2]} between {pairs[0][0]} and {pairs[0][1]})",
                         f"NVLink (intra_node_busbw_gbs {profile.interconnect.intra_node_busbw_gbs})",
                         "NVLink/NVSwitch is down: check nvidia-fabricmanager and "
                         "`nvidia-smi nvlink -s`, then drain the node")
        return Check(node, "topology.nvlink", PASS, "PCIe only (no NVLink)", "no NVLink expected")
    weak = [(a, b, l) for a, b, l in pairs if not l.startswith("NV") or int(l[2:] or 0) < widest]
    if weak:
        shown = ", ".join(f"{a}-{b} {l}" for a, b, l in weak[:6]) + (" ..." if len(weak) > 6 else "")
        gpus_hit = sorted({g for a, b, _ in weak for g in (a, b)},
                          key=lambda g: sum(1 for a, b, _ in weak if g in (a, b)), reverse=True)
        return Check(node, "topology.nvlink", FAIL, shown, f"NV{widest} between every GPU pair",
                     f"NVLinks are down (most affected: {gpus_hit[0]}): check `nvidia-smi nvlink -s`"
                     ", reset the GPU or drain the node", detail={"weak_pairs": weak})
    return Check(node, "topology.nvlink", PASS, f"NV{widest} between all {len(pairs)} GPU pairs",
                 f"NV{widest}")


def _nic_affinity(topo: Topology, profile, node: str) -> list[Check]:
    hcas = [h.split(":")[0] for h in profile.interconnect.hcas]
    if not hcas or not topo.nics:
        return []
    cols = [c for c in topo.nics if topo.nic_name(c) in hcas]
    if not cols:
        return [Check(node, "topology.nic_affinity", WARN, "none of the profile's HCAs in the matrix",
                      ", ".join(hcas), "check interconnect.hcas against `nvidia-smi topo -m`'s "
                      "NIC legend")]
    far = []
    for g in topo.gpus:
        best = min(cols, key=lambda c: RANK.get(link_kind(topo.links.get((g, c), "SYS")), 9))
        kind = link_kind(topo.links.get((g, best), "SYS"))
        if RANK.get(kind, 9) > RANK["PXB"]:
            far.append(f"{g}: nearest {topo.nic_name(best)} via {kind}")
    if far:
        return [Check(node, "topology.nic_affinity", WARN, "; ".join(far),
                      "an HCA on each GPU's PCIe switch (PIX/PXB)",
                      "GPUDirect RDMA crosses the host bridge for these GPUs: list the HCAs next "
                      "to them in NCCL_IB_HCA / interconnect.hcas")]
    return [Check(node, "topology.nic_affinity", PASS, "every GPU has an HCA on its PCIe switch",
                  "PIX/PXB")]
