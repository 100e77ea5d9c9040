"""Checks on parsed real output: healthy fixtures pass, degraded ones fail with the right fix."""

from __future__ import annotations

import os
import shutil

import pytest
import yaml

from hpctrain.preflight import infiniband
from hpctrain.preflight.gpu import check_gpus, parse_gpu_query
from hpctrain.preflight.locate import Locator, pair_up
from hpctrain.preflight.nccl_env import (check_disable, check_ib_hca, check_nccl_env,
                                         check_socket_ifname, effective_env, footguns)
from hpctrain.preflight.nccl_log import check_transport, parse_nccl_transport
from hpctrain.preflight.results import bad_nodes, passed, summary
from hpctrain.preflight.software import compare_versions
from hpctrain.preflight.storage import (check_storage, emergency_checkpoint_row,
                                        estimate_checkpoint_bytes, params_estimate)
from hpctrain.preflight.topology import check_topology, parse_topo_matrix
from hpctrain.config import job_from_mapping
from hpctrain.record.folder import RunFolder
from tests.plan.plan_jobs import GPT2_SMALL, LLAMA2_7B, job_mapping
from tests.preflight.helpers import FIXTURES, fixture_text, h100_profile, make_profile


def by_check(rows):
    return {r.check: r for r in rows}


def ib_rows(name: str, profile=None):
    data = {"ports": infiniband.parse_ibstat(fixture_text(name)), "source": "ibstat",
            "before": {}, "after": {}}
    return by_check(infiniband.check_infiniband(data, profile or h100_profile(), "gpu-017"))


def test_healthy_h100_ports_pass():
    rows = ib_rows("ibstat/h100-all-active.txt")
    assert all(rows[c].status == "pass" for c in ("ib.hcas", "ib.ports", "ib.rate", "ib.link_layer"))


def test_port_down_fails_naming_the_port():
    row = ib_rows("ibstat/h100-port-down.txt")["ib.ports"]
    assert row.status == "fail" and "mlx5_5:1 Down/Polling" in row.measured
    assert "cable" in row.fix


def test_rate_100_on_a_400_link_fails():
    row = ib_rows("ibstat/h100-rate-100.txt")["ib.rate"]
    assert row.status == "fail" and row.measured == "mlx5_6:1 at 100 Gb/s" and row.expected == "400 Gb/s"


def test_unknown_hca_in_profile_fails_with_the_names_found():
    profile = h100_profile(interconnect={"hcas": ["mlx5_0", "mlx5_12"]})
    row = ib_rows("ibstat/h100-all-active.txt", profile)["ib.hcas"]
    assert row.status == "fail" and "missing mlx5_12" in row.measured and "mlx5_9" in row.measured


def test_ethernet_port_on_an_infiniband_profile_fails_link_layer():
    profile = h100_profile(interconnect={"hcas": ["mlx5_0", "mlx5_bond_0"], "port_rate_gbps": 200})
    rows = ib_rows("ibstat/h100-all-active.txt", profile)
    assert rows["ib.link_layer"].status == "fail" and "mlx5_bond_0:1 is Ethernet" in \
        rows["ib.link_layer"].measured


def test_counters_that_grow_between_two_reads(tmp_path):
    root = tmp_path / "ib"
    shutil.copytree(FIXTURES / "sysfs_ib" / "h100", root)
    profile = h100_profile(interconnect={"hcas": ["mlx5_0", "mlx5_1"]})

    def link_flaps(seconds):  # the clock between the two reads: mlx5_1 goes down and up
        (root / "mlx5_1/ports/1/counters/link_downed").write_text("3\n")
        (root / "mlx5_0/ports/1/counters/symbol_error").write_text("17\n")

    data = infiniband.collect(root, interval_s=1, sleep=link_flaps)
    assert data["source"] == "sysfs"
    row = by_check(infiniband.check_infiniband(data, profile, "n1"))["ib.counters"]
    assert row.status == "fail" and "mlx5_1:1 link_downed +3" in row.measured
    assert "mlx5_0:1 symbol_error +17" in row.measured


def test_gpu_missing_fails_count_and_model_checked():
    profile = make_profile(slurm={"gpus_per_node": 8}, node={"gpus": 8, "gpu_model": "A100",
                                                             "device": "cuda"})
    rows = by_check(check_gpus(parse_gpu_query(fixture_text("query_gpu/a100x8-gpu7-missing.csv")),
                               "", profile, "n3"))
    assert rows["gpu.count"].status == "fail" and rows["gpu.count"].measured == "7 GPUs"
    healthy = by_check(check_gpus(parse_gpu_query(fixture_text("query_gpu/a100x8.csv")), "", profile,
                                  "n3"))
    assert healthy["gpu.count"].status == "pass" and healthy["gpu.model"].status == "pass"
    wrong = by_check(check_gpus(parse_gpu_query(fixture_text("query_gpu/h100x8.csv")), "", profile,
                                "n3"))
    assert wrong["gpu.model"].status == "fail" and "H100" in wrong["gpu.model"].measured


def test_gpu_health_fields():
    profile = h100_profile()
    ok = by_check(check_gpus(parse_gpu_query(fixture_text("query_gpu/h100x8-health.csv")), "",
                             profile, "n1"))
    assert {c: r.status for c, r in ok.items()} == {
        "gpu.count": "pass", "gpu.model": "pass", "gpu.ecc": "pass", "gpu.memory_pages": "pass",
        "gpu.clocks": "pass", "gpu.persistence": "pass"}
    bad = by_check(check_gpus(parse_gpu_query(fixture_text("query_gpu/h100x8-health-degraded.csv")),
                              "", profile, "n1"))
    assert bad["gpu.ecc"].status == "fail" and bad["gpu.ecc"].measured == "GPU 5: 2 uncorrected"
    assert bad["gpu.memory_pages"].status == "fail" and "GPU 5" in bad["gpu.memory_pages"].measured
    assert bad["gpu.clocks"].status == "fail" and "GPU 5: HW slowdown" in bad["gpu.clocks"].measured
    assert bad["gpu.persistence"].status == "warn" and "GPU 2" in bad["gpu.persistence"].measured


def test_each_failing_or_warning_gpu_row_says_what_to_do_and_a_passing_one_says_nothing():
    """The report prints a `fix:` line under a row that has one: a healthy node shows none, and
    each GPU problem (ECC errors, a pending remap, a slowdown, persistence off, a missing GPU)
    says what to do."""
    profile = h100_profile()
    for name in ("h100x8-health.csv", "h100x8-health-degraded.csv", "a100x8-gpu7-missing.csv"):
        rows = check_gpus(parse_gpu_query(fixture_text(f"query_gpu/{name}")), "", profile, "n1")
        for row in rows:
            assert bool(row.fix) == (row.status != "pass"), (name, row)
    degraded = by_check(check_gpus(parse_gpu_query(fixture_text(
        "query_gpu/h100x8-health-degraded.csv")), "", profile, "n1"))
    assert "nvidia-smi -r" in degraded["gpu.ecc"].fix
    assert "PERFORMANCE" in degraded["gpu.clocks"].fix
    assert "nvidia-persistenced" in degraded["gpu.persistence"].fix


def test_a_gpu_lost_during_the_query_leaves_the_others_read():
    """A GPU that falls off the bus (Xid 79) while nvidia-smi runs: it prints its error in
    place of that GPU's row and goes on with the others. The seven healthy GPUs are read, the
    count fails at 7 and GPU 5's pending row remap is still found."""
    lines = fixture_text("query_gpu/h100x8-health-degraded.csv").splitlines()
    lines[1 + 4] = "Unable to determine the device handle for GPU0000:9A:00.0: Unknown Error"
    rows = parse_gpu_query("\n".join(lines))
    assert [r["index"] for r in rows] == ["0", "1", "2", "3", "5", "6", "7"]
    checks = by_check(check_gpus(rows, "", h100_profile(), "n1"))
    assert checks["gpu.count"].status == "fail" and checks["gpu.count"].measured == "7 GPUs"
    assert checks["gpu.memory_pages"].status == "fail" and "GPU 5" in checks["gpu.memory_pages"].measured


def test_a_gpu_that_retires_pages_instead_of_remapping_rows():
    """GPUs before the A100 (V100, T4) retire bad memory pages and know no row remapping
    (``[N/A]``): a page retirement pending on GPU 3 fails the node with the reset to apply it;
    nothing pending passes."""
    lines = fixture_text("query_gpu/h100x8-health.csv").splitlines()
    cells = [[c.strip() for c in line.split(",")] for line in lines]
    head = cells[0]
    retired, remap = head.index("retired_pages.pending"), head.index("remapped_rows.pending")
    for row in cells[1:]:
        row[retired] = "No"
        row[remap] = row[remap + 1] = "[N/A]"
    healthy = by_check(check_gpus(parse_gpu_query("\n".join(", ".join(r) for r in cells)), "",
                                  h100_profile(), "n1"))
    assert healthy["gpu.memory_pages"].status == "pass"
    cells[1 + 3][retired] = "Yes"
    row = by_check(check_gpus(parse_gpu_query("\n".join(", ".join(r) for r in cells)), "",
                              h100_profile(), "n1"))["gpu.memory_pages"]
    assert row.status == "fail" and row.measured.endswith("GPU 3") and "reset" in row.fix


def test_nvidia_smi_missing_on_gpu_profile_is_a_failing_row():
    rows = check_gpus(None, "`nvidia-smi` is not on PATH", h100_profile(), "n1")
    assert rows[0].status == "fail" and "nvidia-smi" in rows[0].measured and rows[0].fix


TOPO_NODE = h100_profile(interconnect={"hcas": [f"mlx5_{i}" for i in range(8)]})


def test_topology_nvlink_down_on_one_gpu():
    ok = by_check(check_topology(parse_topo_matrix(fixture_text("topo/h100-8gpu-8nic.txt")), "",
                                 TOPO_NODE, "n1"))
    assert ok["topology.nvlink"].status == "pass" and ok["topology.nvlink"].measured.startswith("NV18")
    assert ok["topology.nic_affinity"].status == "pass"
    bad = by_check(check_topology(parse_topo_matrix(fixture_text("topo/h100-gpu3-nvlink-down.txt")),
                                  "", TOPO_NODE, "n1"))
    row = bad["topology.nvlink"]
    assert row.status == "fail" and "GPU0-GPU3 NODE" in row.measured and "GPU3" in row.fix
    assert len(row.detail["weak_pairs"]) == 7


def test_topology_nic_far_from_gpus():
    # the ibstat node's HCA names (no mlx5_2/mlx5_3) on this topology: GPU2/3 lose their own NIC
    partial = by_check(check_topology(parse_topo_matrix(fixture_text("topo/h100-8gpu-8nic.txt")), "",
                                      h100_profile(), "n1"))["topology.nic_affinity"]
    assert partial.status == "warn" and "GPU2: nearest mlx5_0 via NODE" in partial.measured
    profile = h100_profile(interconnect={"hcas": ["mlx5_0"]})
    row = by_check(check_topology(parse_topo_matrix(fixture_text("topo/h100-8gpu-8nic.txt")), "",
                                  profile, "n1"))["topology.nic_affinity"]
    assert row.status == "warn" and "GPU4: nearest mlx5_0 via SYS" in row.measured


def test_a_pcie_only_node_passes_unless_its_profile_expects_nvlink_bandwidth():
    """A node of PCIe GPUs (no NVLink: GPUs two by two on a PCIe switch, the other pairs of a
    socket meet at a host bridge of its NUMA node, the rest across the CPUs). With a profile expecting PCIe bandwidth inside the node
    it passes; with one expecting more than PCIe can carry it fails, naming the first pair's
    link and the fabric to check."""
    lines = fixture_text("topo/h100-8gpu-8nic.txt").splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith("GPU"):
            g = int(ln.split()[0][3:])
            cells = ln.split()
            for j in range(8):
                if cells[1 + j].startswith("NV"):
                    cells[1 + j] = ("PIX" if g // 2 == j // 2 else "NODE" if g // 4 == j // 4
                                    else "SYS")
            lines[i] = "    ".join(cells)
    topo = parse_topo_matrix("\n".join(lines))
    pcie = h100_profile(interconnect={"intra_node_busbw_gbs": 25})
    ok = by_check(check_topology(topo, "", pcie, "n1"))["topology.nvlink"]
    assert ok.status == "pass" and ok.measured == "PCIe only (no NVLink)"
    bad = by_check(check_topology(topo, "", h100_profile(), "n1"))["topology.nvlink"]
    assert bad.status == "fail"
    assert bad.measured == "no NVLink between any GPU pair (PIX between GPU0 and GPU1)"
    assert "intra_node_busbw_gbs 360" in bad.expected and "fabricmanager" in bad.fix


def test_an_hca_behind_the_host_bridge_warns_and_one_behind_several_pcie_switches_passes():
    """A server whose PCIe layout differs per GPU: GPU1's HCA hangs off the host bridge (PHB),
    so its GPUDirect RDMA crosses the CPU, and the preflight names it (not GPU0's HCA, as far on
    another bridge of the socket); GPU0's sits behind two PCIe switches (PXB), still a direct
    path, and passes like the PIX ones."""
    text = fixture_text("topo/h100-8gpu-8nic.txt")
    lines = text.splitlines()

    def set_cell(row: str, col: int, value: str) -> None:
        i = next(k for k, ln in enumerate(lines) if ln.startswith(row + " "))
        cells = lines[i].split()
        cells[1 + col] = value
        lines[i] = "    ".join(cells)
    for gpu, nic, link in ((0, 0, "PXB"), (1, 1, "PHB")):
        set_cell(f"GPU{gpu}", 8 + nic, link)
        set_cell(f"NIC{nic}", gpu, link)
    topo = parse_topo_matrix("\n".join(lines))
    assert topo.links[("GPU0", "NIC0")] == "PXB" and topo.links[("GPU1", "NIC1")] == "PHB"
    row = by_check(check_topology(topo, "", TOPO_NODE, "n1"))["topology.nic_affinity"]
    assert row.status == "warn" and row.measured == "GPU1: nearest mlx5_1 via PHB"


def test_a_gpu_without_its_own_hca_is_pointed_to_the_nearest_one_on_its_socket():
    """A profile that lists two of the node's HCAs, one per socket (mlx5_0:1, mlx5_5:1): each GPU
    of socket 1 without its own HCA is told of mlx5_5 on its socket (NODE), not of mlx5_0
    across the CPUs (SYS), though mlx5_0 comes first in the matrix."""
    profile = h100_profile(interconnect={"hcas": ["mlx5_0:1", "mlx5_5:1"]})  # with their ports
    row = by_check(check_topology(parse_topo_matrix(fixture_text("topo/h100-8gpu-8nic.txt")), "",
                                  profile, "n1"))["topology.nic_affinity"]
    assert row.status == "warn"
    assert row.measured.split("; ") == [
        "GPU1: nearest mlx5_0 via NODE", "GPU2: nearest mlx5_0 via NODE",
        "GPU3: nearest mlx5_0 via NODE", "GPU4: nearest mlx5_5 via NODE",
        "GPU6: nearest mlx5_5 via NODE", "GPU7: nearest mlx5_5 via NODE"]


def test_nccl_env_hca_names_ports_and_prefixes():
    devices = {p.device: {p.port} for p in
               infiniband.parse_ibstat(fixture_text("ibstat/h100-all-active.txt"))}
    profile = h100_profile(interconnect={"socket_ifname": "eth0"})

    def rows(**env):
        return by_check(check_nccl_env({"NCCL_SOCKET_IFNAME": "eth0", **env}, profile, devices,
                                       ["eth0", "lo"], 2, "n1"))
    assert rows(NCCL_IB_HCA="=mlx5_0:1,mlx5_4:1")["nccl.ib_hca"].status == "pass"
    assert rows(NCCL_IB_HCA="mlx5")["nccl.ib_hca"].measured.startswith("selects mlx5_0, mlx5_1")
    bad = rows(NCCL_IB_HCA="mlx5_0,mlx5_3")["nccl.ib_hca"]
    assert bad.status == "fail" and "mlx5_3 matches no HCA" in bad.measured
    assert rows(NCCL_IB_HCA="mlx5_0:2")["nccl.ib_hca"].status == "fail"
    assert rows(NCCL_IB_HCA="^mlx5_42")["nccl.ib_hca"].status == "warn"
    assert rows(NCCL_IB_DISABLE="1")["nccl.ib_disable"].status == "fail"
    lo = by_check(check_nccl_env({"NCCL_SOCKET_IFNAME": "lo"}, profile, devices, ["eth0", "lo"], 2,
                                 "n1"))["nccl.socket_ifname"]
    assert lo.status == "fail" and "lo" in lo.fix
    typo = by_check(check_nccl_env({"NCCL_SOCKET_IFNAME": "bond0"}, profile, devices,
                                   ["eth0", "lo"], 2, "n1"))["nccl.socket_ifname"]
    assert typo.status == "fail" and "no interface bond0" in typo.measured


def test_an_exact_hca_list_selects_those_hcas_and_a_prefix_catches_the_ethernet_bond_too():
    """On the H100 node (mlx5_0 ... mlx5_9 and an Ethernet bond, mlx5_bond_0), `mlx5` is a
    prefix that also selects the bond; `=mlx5_0,mlx5_1` selects exactly those two, and
    `^=mlx5_bond_0` every HCA but the bond."""
    devices = {p.device: {p.port} for p in
               infiniband.parse_ibstat(fixture_text("ibstat/h100-all-active.txt"))}
    profile = h100_profile()
    prefix = check_ib_hca("mlx5", devices, profile, "n1")
    assert prefix.status == "pass" and "mlx5_bond_0" in prefix.measured
    exact = check_ib_hca("=mlx5_0,mlx5_1", devices, profile, "n1")
    assert exact.status == "pass" and exact.measured == "selects mlx5_0, mlx5_1"
    but_bond = check_ib_hca("^=mlx5_bond_0", devices, profile, "n1")
    assert but_bond.measured == "selects " + ", ".join(
        f"mlx5_{i}" for i in (0, 1, 4, 5, 6, 7, 8, 9))


def test_the_profiles_nccl_settings_are_exported_over_the_jobs_environment():
    """What a rank sees: the job's environment with the profile's ``env`` over it (the
    profile's NCCL_IB_HCA wins over the shell's; the shell's other variables stay); without
    an environment given, this process's."""
    profile = h100_profile(env={"NCCL_IB_HCA": "=mlx5_0", "NCCL_DEBUG": "WARN"})
    env = effective_env(profile, {"NCCL_IB_HCA": "mlx5_9", "SLURM_JOB_ID": "42"})
    assert env == {"NCCL_IB_HCA": "=mlx5_0", "NCCL_DEBUG": "WARN", "SLURM_JOB_ID": "42"}
    here = effective_env(profile)
    assert here["PATH"] == os.environ["PATH"] and here["NCCL_IB_HCA"] == "=mlx5_0"


def test_settings_that_force_sockets_fail_on_infiniband_and_lo_is_fine_on_one_node():
    """`NCCL_NET=Socket` on an InfiniBand profile forces TCP: fail; on an Ethernet profile there
    is no IB to lose. `lo` as the socket interface cannot reach another node: fail on two nodes,
    pass on one."""
    ib, eth = h100_profile(), h100_profile(interconnect={"kind": "ethernet"})
    net = check_disable({"NCCL_NET": "Socket"}, ib, "n1")
    assert net.status == "fail" and net.measured == "NCCL_NET=Socket"
    assert check_disable({"NCCL_NET": "Socket"}, eth, "n1").status == "skip"
    assert check_disable({}, ib, "n1").status == "pass"
    assert check_socket_ifname("lo", ["eth0", "lo"], ib, 2, "n1").status == "fail"
    assert check_socket_ifname("lo", ["eth0", "lo"], ib, 1, "n1").status == "pass"


def test_the_recommended_debug_level_and_named_gdr_levels_are_no_foot_guns():
    """NCCL_DEBUG=WARN or INFO (what the docs recommend) and a named GPUDirect level (PXB) raise
    nothing; TRACE does, a numeric level (2) is deprecated, and LOC or 0 turns GDR off."""
    assert footguns({"NCCL_DEBUG": "WARN", "NCCL_NET_GDR_LEVEL": "PXB"}, 2) == []
    assert footguns({"NCCL_DEBUG": "INFO"}, 2) == []
    assert footguns({"NCCL_DEBUG": "trace"}, 2)[0].startswith("NCCL_DEBUG=TRACE slows")
    assert footguns({"NCCL_NET_GDR_LEVEL": "2"}, 2) == [
        "NCCL_NET_GDR_LEVEL=2: numeric levels are deprecated, use LOC/PIX/PXB/PHB/SYS"]
    assert "disables GPUDirect RDMA" in footguns({"NCCL_NET_GDR_LEVEL": "0"}, 2)[0]
    assert "deprecated" in footguns({"NCCL_NET_GDR_LEVEL": "5"}, 2)[0]     # SYS, the last
    assert "is not one of" in footguns({"NCCL_NET_GDR_LEVEL": "6"}, 2)[0]


def test_nccl_env_footguns_warn():
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_NET_GDR_LEVEL": "LOC", "NCCL_DEBUG": "TRACE",
           "NCCL_ALGO": "Ring", "NCCL_SOCKET_IFNAME": "eth0"}
    row = by_check(check_nccl_env(env, h100_profile(), None, ["eth0"], 2, "n1"))["nccl.settings"]
    assert row.status == "warn"
    for word in ("NCCL_P2P_DISABLE", "GPUDirect RDMA", "TRACE", "NCCL_ALGO"):
        assert word in row.measured
    odd = by_check(check_nccl_env({"NCCL_NET_GDR_LEVEL": "FAST"}, h100_profile(), None, ["eth0"], 2,
                                  "n1"))["nccl.settings"]
    assert "not one of LOC/PIX/PXB/PHB/SYS" in odd.measured


def test_transport_socket_on_ib_profile_fails_loudly():
    sock = check_transport(parse_nccl_transport(fixture_text("nccl_log/socket-fallback.log")),
                           h100_profile(), "n2", 2)
    assert sock.status == "fail" and "NET/Socket x4" in sock.measured and "no IB device" in sock.measured
    ib = check_transport(parse_nccl_transport(fixture_text("nccl_log/roce-net-ib.log")),
                         h100_profile(interconnect={"kind": "roce"}), "n2", 2)
    assert ib.status == "pass" and "NET/IB x2" in ib.measured


def test_infiniband_without_gpudirect_rdma_warns_with_the_fix():
    """NCCL uses the IB NICs but copies through host memory (nvidia-peermem not loaded): the
    job runs, slower; preflight says so and how to fix it."""
    summary = parse_nccl_transport(fixture_text("nccl_log/ib-no-gdr.log"))
    assert summary["via"]["NET/IB"] == 2 and summary["gdr_channels"] == 0
    row = check_transport(summary, h100_profile(interconnect={"kind": "infiniband"}), "n2", 2)
    assert row.status == "warn" and row.measured == ("network IB; channels NET/IB x2, P2P/IPC x14 "
                                                    "without GPUDirect RDMA")
    assert row.expected == "NET/IB/GDRDMA" and "nvidia-peermem" in row.fix



def test_a_log_without_channel_lines_asks_for_them_on_several_nodes_only():
    """NCCL_DEBUG_SUBSYS without INIT/NET: the log names the network but no channel. Between two
    nodes that leaves the inter-node transport unknown (warn, with the setting that shows it);
    on one node there is nothing between nodes to check."""
    text = "\n".join(line for line in fixture_text("nccl_log/roce-net-ib.log").splitlines()
                     if " via " not in line)
    summary = parse_nccl_transport(text)
    assert summary["networks"] == {"IB": 1} and summary["via"] == {}
    profile = h100_profile(interconnect={"kind": "roce"})
    two = check_transport(summary, profile, "n2", 2)
    assert two.status == "warn" and two.expected == "NET/IB between nodes"
    assert "NCCL_DEBUG_SUBSYS=INIT,NET" in two.fix
    one = check_transport(summary, profile, "n1", 1)
    assert one.status == "pass" and one.measured == "network IB; channels none"


MOUNTS = "overlay / overlay rw 0 0\n{dev} {point} {fs} rw 0 0\n"


def test_storage_local_disk_on_multi_node_fails(tmp_path):
    profile = make_profile(slurm={"nodes": 4}, preemption={"lead_time_s": 120})
    rows = by_check(check_storage(str(tmp_path / "ck"), profile, 4, "n1", probe_mb=2,
                                  checkpoint_bytes=None,
                                  mounts_text=MOUNTS.format(dev="/dev/sda1", point=tmp_path, fs="xfs")))
    assert rows["storage.shared"].status == "fail" and "xfs" in rows["storage.shared"].measured
    assert rows["storage.writable"].status == "pass" and not (tmp_path / "ck").exists()
    shared = by_check(check_storage(str(tmp_path / "ck"), profile, 4, "n1", probe_mb=0,
                                    checkpoint_bytes=None,
                                    mounts_text=MOUNTS.format(dev="srv:/x", point=tmp_path, fs="nfs4")))
    assert shared["storage.shared"].status == "pass"


def test_storage_free_space_and_emergency_checkpoint(tmp_path):
    profile = make_profile(storage={"min_free_gb": 1e7}, preemption={"lead_time_s": 1})  # 10 PB
    rows = by_check(check_storage(str(tmp_path), profile, 1, "n1", probe_mb=4,
                                  checkpoint_bytes=int(500e9), mounts_text=""))
    assert rows["storage.free"].status == "fail"
    ck = rows["storage.emergency_ckpt"]
    assert ck.status == "fail" and ck.detail["seconds"] > 1 and "lead_time_s" in ck.expected
    assert rows["storage.write_bw"].detail["mb_per_s"] > 0


def test_storage_unmounted_root_is_reported_not_created(tmp_path):
    rows = check_storage("/hpctrain-no-such-mount/ckpt", make_profile(), 2, "n1", probe_mb=0,
                         checkpoint_bytes=None, mounts_text="")
    assert rows[0].status == "fail" and "does not exist" in rows[0].measured


def test_local_disk_is_enough_for_one_node_or_nodes_that_share_one_host(tmp_path):
    """A one-node job, or a job whose nodes all run on one host (a dev cluster), may checkpoint
    to a local disk: the row passes and says why."""
    mounts = MOUNTS.format(dev="/dev/nvme0n1", point=tmp_path, fs="ext4")
    one = by_check(check_storage(str(tmp_path / "ck"), make_profile(), 1, "n1", probe_mb=0,
                                 checkpoint_bytes=None, mounts_text=mounts))["storage.shared"]
    assert one.status == "pass" and one.measured == f"ext4 at {tmp_path} (single node)"
    host = by_check(check_storage(str(tmp_path / "ck"), make_profile(), 4, "n1", probe_mb=0,
                                  checkpoint_bytes=None, mounts_text=mounts,
                                  one_host=True))["storage.shared"]
    assert host.status == "pass" and host.measured == f"ext4 at {tmp_path} (all nodes on one host)"


def test_room_for_one_checkpoint_but_not_two_warns(tmp_path):
    """A new checkpoint is written before the old one goes: a disk that holds 2.5 checkpoints
    passes, one that holds 1.5 warns with the room two need."""
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize      # other writers move it by far less than the margins

    def row(checkpoints_that_fit: float):
        ck = int(free / checkpoints_that_fit)
        r = by_check(check_storage(str(tmp_path), make_profile(storage={"min_free_gb": 0.001}), 1,
                                   "n1", probe_mb=0, checkpoint_bytes=ck, mounts_text=""))
        return r["storage.free"], ck
    roomy, _ = row(2.5)
    assert roomy.status == "pass"
    tight, ck = row(1.5)
    assert tight.status == "warn" and tight.expected.startswith(f">= {2 * ck / 1e9:.1f} GB ")


def test_a_slow_filesystem_fails_the_emergency_checkpoint_and_more_nodes_share_it():
    """A 150 GB checkpoint written at 1000 MB/s by every node at once, with 60 s between the
    preemption signal and the kill: on 2 nodes each writes 75 GB in 75 s (fail), on 4 nodes
    37.5 GB in 37.5 s (more than half the lead time: warn), on 8 nodes 18.75 GB (pass)."""
    rows = {n: emergency_checkpoint_row("n1", 1000.0, int(150e9), n, 60) for n in (2, 4, 8)}
    assert [rows[n].status for n in (2, 4, 8)] == ["fail", "warn", "pass"]
    assert rows[4].measured == "~38 s for 37.5 GB per node at 1000 MB/s"
    assert rows[4].detail["seconds"] == pytest.approx(37.5)
    assert "lead_time_s" in rows[2].fix and "lead_time_s" in rows[4].fix and rows[8].fix == ""
    unknown = emergency_checkpoint_row("n1", 1000.0, None, 2, 60)
    assert unknown.status == "warn" and "run folder" in unknown.fix


@pytest.mark.parametrize("model, published", [(GPT2_SMALL, 124_439_808),
                                              (LLAMA2_7B, 6_738_415_616)])
def test_a_run_that_has_not_saved_yet_is_sized_from_its_model(tmp_path, model, published):
    """Before the first checkpoint, the emergency save's size is the job's model in Adam's
    state: parameters within 0.2% of the published counts (GPT-2 small, learned positions and
    tied embeddings; Llama-2 7B, SwiGLU and untied), 14 bytes each in bf16 (weights, fp32
    main copy, two moments), 12 in fp32. Once a checkpoint exists, its size is used."""
    params = params_estimate(job_from_mapping(job_mapping(model), "t").model)
    assert params == pytest.approx(published, rel=0.002)
    assert isinstance(params, int)       # a count, printed as such in the JSON report
    for precision, per_param in (("bf16", 14), ("fp32", 12)):
        run = tmp_path / precision
        run.mkdir()
        (run / "job.yaml").write_text(yaml.safe_dump(job_mapping(model, precision=precision)))
        assert estimate_checkpoint_bytes(str(run)) == params * per_param
    saved = RunFolder(tmp_path / "bf16").checkpoint_dir() / "iter_0000010"
    saved.mkdir(parents=True)
    (saved / "shard").write_bytes(b"x" * 1000)
    assert estimate_checkpoint_bytes(str(tmp_path / "bf16")) == 1000


def test_versions_mismatch_blames_the_minority():
    v = {"torch": "2.5.1", "nccl": "2.21.5", "megatron-core": "0.16.1"}
    rows = by_check(compare_versions({"n1": v, "n2": v, "n3": {**v, "nccl": "2.18.3"}}))
    assert rows["software.nccl"].status == "fail" and rows["software.nccl"].measured == "n3: 2.18.3"
    assert rows["software.torch"].status == "pass"
    assert bad_nodes(list(rows.values())) == ["n3"]


def test_locator_pairs_then_cross_checks():
    assert pair_up(["a", "b", "c", "d", "e"]) == [["a", "b"], ["c", "d", "e"]]
    loc = Locator(["n1", "n2", "n3", "n4"], floor=None, outlier_fraction=0.5)
    speed = {"n1": 10, "n2": 10, "n3": 10, "n4": 1}  # a group runs at its slowest node

    def measure(groups):
        return {tuple(g): min(speed[n] for n in g) for g in groups}

    while (groups := loc.next_groups()) is not None:
        loc.record(measure(groups))
    assert loc.culprits == ["n4"] and "n3" in loc.cleared
    assert [r["stage"] for r in loc.rounds] == ["pairs", "cross"]


def test_locator_blames_nobody_when_every_pair_is_slow():
    loc = Locator(["n1", "n2", "n3", "n4"], floor=20.0, outlier_fraction=0.5)
    groups = loc.next_groups()
    loc.record({tuple(g): 5.0 for g in groups})
    assert loc.next_groups() is None and loc.culprits == [] and "fabric" in loc.note


def test_summary_names_bad_nodes():
    rows = ib_rows("ibstat/h100-port-down.txt")
    rows = list(rows.values())
    assert not passed(rows) and bad_nodes(rows) == ["gpu-017"]
    assert summary(rows).startswith("FAILED") and "gpu-017" in summary(rows)


def test_a_real_one_gpu_h100_node_passes_its_gpu_and_topology_checks():
    """Captured on an H100 80GB HBM3 (driver 580.159.04) with the query hpctrain sends: nvidia-smi
    answers clocks_event_reasons for the older name, underlines the topology header with ANSI
    escapes even into a pipe, and a one-GPU matrix has no GPU pair."""
    profile = make_profile(slurm={"gpus_per_node": 1}, node={"gpus": 1, "gpu_model": "H100",
                                                             "device": "cuda"})
    rows = by_check(check_gpus(parse_gpu_query(fixture_text("query_gpu/h100x1-real.csv")), "",
                               profile, "n1"))
    assert {c: r.status for c, r in rows.items()} == {
        "gpu.count": "pass", "gpu.model": "pass", "gpu.ecc": "pass", "gpu.memory_pages": "pass",
        "gpu.clocks": "pass", "gpu.persistence": "pass"}
    topo = parse_topo_matrix(fixture_text("topo/h100-1gpu-real.txt"))
    assert topo.gpus == ["GPU0"] and topo.cpu_affinity == {"GPU0": "0-15"}
    checks = by_check(check_topology(topo, "", profile, "n1"))
    assert checks["topology.nvlink"].status == "skip"


def test_transport_older_nccl_announcing_sockets_only_fails_on_an_ib_profile():
    """NCCL 2.4/2.5 print no `Using network` line: `NET/IB : No device found.` then
    `NET/Socket : Using ...` is the whole announcement, and this rank's channels are all P2P."""
    summary = parse_nccl_transport(fixture_text("nccl_log/socket-announced-older-nccl.log"))
    assert summary["networks"] == {} and summary["via"] == {"P2P/IPC": 2}
    assert summary["no_ib_device"] and summary["socket_announced"]
    row = check_transport(summary, h100_profile(), "n1", 2)
    assert row.status == "fail" and "no IB device" in row.measured and "Socket" in row.measured
    # the same log where the profile expects Ethernet is not a failure
    eth = check_transport(summary, h100_profile(interconnect={"kind": "ethernet"}), "n1", 2)
    assert eth.status != "fail"
    # the newer IB log, which also says `NET/Socket`-free things, still passes
    ib = check_transport(parse_nccl_transport(fixture_text("nccl_log/roce-net-ib.log")),
                         h100_profile(interconnect={"kind": "roce"}), "n2", 2)
    assert ib.status == "pass" and not ib.detail["socket_announced"]


def test_the_shipped_h100_profile_fails_a_socket_fallback_and_passes_ib():
    """The profile a user submits with is read from its YAML file (not built in code): its
    transport check runs and fails the run that fell back to sockets."""
    from hpctrain.config import load_profile
    profile = load_profile("h100-ib-pyxis")
    sock = check_transport(parse_nccl_transport(fixture_text("nccl_log/socket-fallback.log")),
                           profile, "n2", 2)
    assert sock.status == "fail" and sock.expected == "NET/IB"
    gdr = check_transport(parse_nccl_transport(fixture_text("nccl_log/roce-net-ib.log")),
                          profile, "n2", 2)
    assert gdr.status == "pass" and gdr.expected == "NET/IB"


def test_a_node_whose_log_was_never_read_warns_and_says_how_to_get_it():
    """The node's NCCL log never reached the store (NCCL_DEBUG_FILE not honoured): no verdict
    on its transport, a warning that names the setting to rerun with."""
    row = check_transport(None, h100_profile(), "n3", 2)
    assert row.status == "warn" and row.measured == "no NCCL INFO lines found"
    assert "NCCL_DEBUG=INFO" in row.fix


def test_older_nccl_without_a_network_line_is_judged_by_its_channels():
    """NCCL releases that print no `Using network` line still log each channel: channels over
    NET/IB/GDRDMA pass, channels over NET/Socket fail on an InfiniBand profile."""
    ib_text = "\n".join(line for line in fixture_text("nccl_log/roce-net-ib.log").splitlines()
                        if "Using network" not in line)
    ib = parse_nccl_transport(ib_text)
    assert ib["networks"] == {} and ib["via"]["NET/IB"] == 2
    row = check_transport(ib, h100_profile(interconnect={"kind": "roce"}), "n2", 2)
    assert row.status == "pass" and row.measured.startswith("network -; channels NET/IB x2")
    sock_text = "\n".join(line for line in fixture_text("nccl_log/socket-fallback.log").splitlines()
                          if "Using network" not in line)
    sock = check_transport(parse_nccl_transport(sock_text), h100_profile(), "n2", 2)
    assert sock.status == "fail" and "NET/Socket x4" in sock.measured


def test_a_rank_with_only_local_ring_neighbours_still_fails_a_socket_network():
    """The rank's ring neighbours are on its own node, so it logs no NET/ channel, but NCCL
    said `Using network Socket`: its inter-node traffic goes over TCP all the same."""
    text = "\n".join(line for line in fixture_text("nccl_log/socket-fallback.log").splitlines()
                     if " via " not in line)
    summary = parse_nccl_transport(text)
    assert summary["networks"] == {"Socket": 1} and summary["via"] == {}
    row = check_transport(summary, h100_profile(), "n1", 2)
    assert row.status == "fail" and "Socket" in row.measured


def test_an_ethernet_cluster_passes_whatever_transport_nccl_chose():
    """On a cluster whose profile says Ethernet, TCP sockets are the expected transport: no
    failure, no warning about missing IB channels between its two nodes."""
    profile = h100_profile(interconnect={"kind": "ethernet"})
    for log in ("nccl_log/socket-fallback.log", "nccl_log/roce-net-ib.log"):
        row = check_transport(parse_nccl_transport(fixture_text(log)), profile, "n2", 2)
        assert row.status == "pass" and row.expected == "any", (log, row)


def test_a_profile_naming_hca_ports_finds_them_and_misses_a_port_the_hca_lacks():
    # NCCL_IB_HCA's form, mlx5_0:1: the healthy H100 node has port 1 of each HCA
    hcas = ["mlx5_0:1", "mlx5_1:1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
    rows = ib_rows("ibstat/h100-all-active.txt",
                   h100_profile(interconnect={"hcas": hcas}))
    assert rows["ib.hcas"].status == "pass" and rows["ib.ports"].status == "pass"
    rows = ib_rows("ibstat/h100-all-active.txt",
                   h100_profile(interconnect={"hcas": ["mlx5_0:2", *hcas[1:]]}))
    assert rows["ib.hcas"].status == "fail" and rows["ib.hcas"].measured.startswith(
        "missing mlx5_0:2 (found: ")
