"""Parsers on real captured tool output (tests/fixtures/preflight/SOURCES.md says from where)."""

from __future__ import annotations

import re
import shutil

import pytest

from hpctrain.preflight.bandwidth import algbw, busbw, default_sizes_mb
from hpctrain.preflight.gpu import parse_gpu_query, throttle_reasons
from hpctrain.preflight.infiniband import parse_ibstat, read_sysfs
from hpctrain.preflight.nccl_env import parse_spec
from hpctrain.preflight.nccl_log import parse_nccl_transport
from hpctrain.preflight.nccl_tests import parse_all_reduce_perf
from hpctrain.preflight.storage import fs_kind, mount_for, parse_proc_mounts
from hpctrain.preflight.topology import parse_topo_matrix

from tests.conftest import REPO
from tests.preflight.helpers import FIXTURES, fixture_text


def test_ibstat_h100_reads_every_port_with_state_rate_and_link_layer():
    ports = parse_ibstat(fixture_text("ibstat/h100-all-active.txt"))
    assert [p.device for p in ports] == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7",
                                         "mlx5_8", "mlx5_9", "mlx5_bond_0"]
    ib = [p for p in ports if p.link_layer == "InfiniBand"]
    assert len(ib) == 8 and all(p.active and p.link_up and p.rate_gbps == 400 for p in ib)
    bond = ports[-1]
    assert (bond.link_layer, bond.rate_gbps) == ("Ethernet", 200)


def test_ibstat_with_tabs_and_down_ports():
    ports = {p.device: p for p in parse_ibstat(fixture_text("ibstat/h100-some-down.txt"))}
    assert len(ports) == 12
    down = sorted(d for d, p in ports.items() if not p.active)
    assert down == ["mlx5_2", "mlx5_7", "mlx5_8"]
    assert ports["mlx5_2"].phys_state == "Disabled" and not ports["mlx5_2"].link_up
    assert ports["mlx5_1"].rate_gbps == 100


def test_ibstat_ignores_ibpanic_line_of_vanished_device():
    ports = parse_ibstat(fixture_text("ibstat/a100-hdr-ibpanic.txt"))
    assert [p.device for p in ports] == [f"mlx5_{i}" for i in range(8)]
    assert {p.rate_gbps for p in ports} == {200}


def test_derived_degraded_ibstat_variants():
    down = {p.device: p for p in parse_ibstat(fixture_text("ibstat/h100-port-down.txt"))}
    assert not down["mlx5_5"].active and down["mlx5_5"].phys_state == "Polling"
    slow = {p.device: p for p in parse_ibstat(fixture_text("ibstat/h100-rate-100.txt"))}
    assert slow["mlx5_6"].rate_gbps == 100 and slow["mlx5_5"].rate_gbps == 400


def test_sysfs_tree_reads_states_rates_and_counters():
    ports, counters, problem = read_sysfs(FIXTURES / "sysfs_ib" / "h100")
    assert problem == ""
    assert [(p.device, p.port, p.state, p.phys_state, p.rate_gbps, p.link_layer) for p in ports] == [
        ("mlx5_0", 1, "Active", "LinkUp", 400.0, "InfiniBand"),
        ("mlx5_1", 1, "Active", "LinkUp", 400.0, "InfiniBand")]
    assert counters[("mlx5_0", 1)] == {"link_downed": 0, "symbol_error": 0}


def test_sysfs_missing_root_is_a_problem_not_an_exception(tmp_path):
    ports, counters, problem = read_sysfs(tmp_path / "absent")
    assert ports == [] and "cannot read" in problem


def test_topo_matrix_h100_links_and_nic_legend():
    t = parse_topo_matrix(fixture_text("topo/h100-8gpu-8nic.txt"))
    assert t.gpus == [f"GPU{i}" for i in range(8)]
    assert [t.nic_name(n) for n in t.nics] == [f"mlx5_{i}" for i in range(8)]
    assert t.links[("GPU0", "GPU7")] == "NV18" and t.links[("GPU5", "GPU5")] == "X"
    assert t.links[("GPU5", "NIC5")] == "PIX" and t.links[("GPU5", "NIC0")] == "SYS"
    assert t.cpu_affinity["GPU6"] == "48-95,144-191"


def test_topo_matrix_rejects_other_output():
    with pytest.raises(ValueError, match="header"):
        parse_topo_matrix("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_gpu_query_header_units_and_na():
    rows = parse_gpu_query(fixture_text("query_gpu/a100x8.csv"))
    assert len(rows) == 8
    assert rows[5] == {"index": "5", "name": "NVIDIA A100-SXM4-80GB", "memory.used": "0",
                       "memory.total": "81920", "utilization.gpu": "0"}
    health = parse_gpu_query(fixture_text("query_gpu/h100x8-health-degraded.csv"))
    assert health[5]["ecc.errors.uncorrected.volatile.total"] == "2"
    assert health[5]["retired_pages.pending"] is None  # [N/A]
    assert throttle_reasons(int(health[5]["clocks_throttle_reasons.active"], 16)) == \
        [("HW slowdown", "fail")]


def test_gpu_query_noheader_needs_field_names():
    text = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n"
    rows = parse_gpu_query(text, ["index", "name", "memory.total"])
    assert [r["memory.total"] for r in rows] == ["81559", "81559"]


def test_nccl_log_ib_run_counts_channels_and_gdr():
    s = parse_nccl_transport(fixture_text("nccl_log/roce-net-ib.log"))
    assert s["networks"] == {"IB": 1}
    assert s["via"] == {"NET/IB": 2, "P2P/IPC": 14}
    assert s["gdr_channels"] == 2 and s["version"] == "2.27.5+cuda12.9"
    assert "mlx5_11" in s["ib_hcas"] and len(s["ib_hcas"]) == 8


def test_nccl_log_socket_fallback():
    s = parse_nccl_transport(fixture_text("nccl_log/socket-fallback.log"))
    assert s["networks"] == {"Socket": 1} and s["via"] == {"NET/Socket": 4}
    assert s["no_ib_device"] and s["gdr_channels"] == 0


@pytest.mark.parametrize("name", ["a100x16-roce-10g.txt", "gh200x2-sweep.txt"])
def test_busbw_matches_nccl_tests_own_numbers(name):
    out = parse_all_reduce_perf(fixture_text(f"nccl_tests/{name}"))
    assert out["rows"] and out["nranks"] in (2, 16)
    for r in out["rows"]:
        a = algbw(r["size"], r["time_us"] / 1e6)
        assert a == pytest.approx(r["algbw"], abs=0.006)
        assert busbw(r["algbw"], out["nranks"]) == pytest.approx(r["busbw"], abs=0.006)
        assert busbw(r["inplace_algbw"], out["nranks"]) == pytest.approx(r["inplace_busbw"], abs=0.006)


def test_busbw_factor_is_two_n_minus_one_over_n():
    assert busbw(10.0, 16) == pytest.approx(18.75)
    assert busbw(10.0, 2) == pytest.approx(10.0)
    assert busbw(10.0, 1) == 0.0


def test_the_default_sweeps_span_what_the_docs_say_four_times_per_step_to_the_plateau():
    """Without ``preflight.sizes_mb`` a GPU node sweeps 1 MB to 1 GB and a CPU rehearsal 0.25 to
    16 MB (docs/health.md), each size four times the one before (nccl-tests' ``-f 4``: rows
    evenly spaced on a log scale). The GPU sweep's last size, the one the gate judges, lies on
    the plateau of a real sweep between two nodes (gh200: within 3% of its peak)."""
    m = re.search(r"(\S+) MB-(\S+) GB on GPUs, (\S+)-(\S+) MB on CPU",
                  (REPO / "docs" / "health.md").read_text())
    gpu, cpu = default_sizes_mb("cuda"), default_sizes_mb("cpu")
    assert (gpu[0], gpu[-1]) == (float(m[1]), float(m[2]) * 1024)
    assert (cpu[0], cpu[-1]) == (float(m[3]), float(m[4]))
    for sweep in (gpu, cpu):
        assert [b / a for a, b in zip(sweep, sweep[1:])] == [4] * (len(sweep) - 1)
    real = parse_all_reduce_perf(fixture_text("nccl_tests/gh200x2-sweep.txt"))["rows"]
    peak = max(r["busbw"] for r in real)
    plateau = min(r["size"] for r in real if r["busbw"] >= 0.97 * peak)
    assert gpu[-1] * 2**20 >= plateau


def test_nccl_spec_prefixes_and_ports():
    s = parse_spec("^=mlx5_0:1,mlx5_3", ports=True)
    assert (s.exclude, s.exact, s.entries) == (True, True, [("mlx5_0", 1), ("mlx5_3", None)])
    s = parse_spec("mlx5")
    assert not s.exclude and not s.exact and s.matches("mlx5_11", "mlx5")


def test_proc_mounts_escapes_and_longest_prefix():
    text = ("overlay / overlay rw,relatime 0 0\n"
            "10.0.0.5@o2ib:/fsw /lustre lustre rw,flock 0 0\n"
            "/dev/nvme0n1 /scratch\\040local ext4 rw 0 0\n"
            "nfs-srv:/home /home nfs4 rw,vers=4.2 0 0\n")
    mounts = parse_proc_mounts(text)
    assert mounts[2].point == "/scratch local"
    assert mount_for("/lustre/fsw/ckpt", mounts).fstype == "lustre"
    assert mount_for("/scratch local/x", mounts).fstype == "ext4"
    assert mount_for("/tmp/x", mounts).fstype == "overlay"
    assert [fs_kind(m.fstype) for m in mounts] == ["local", "shared", "local", "shared"]


def test_a_port_whose_files_cannot_all_be_read_still_counts_as_present(tmp_path):
    # a driver mid-reset: mlx5_1's port 1 has its state but no rate or link layer yet
    root = tmp_path / "sysfs"
    shutil.copytree(FIXTURES / "sysfs_ib" / "h100", root)
    for name in ("rate", "link_layer"):
        (root / "mlx5_1" / "ports" / "1" / name).unlink()
    ports, counters, problem = read_sysfs(root)
    assert problem == ""
    assert [(p.device, p.port, p.state, p.rate_gbps) for p in ports] == [
        ("mlx5_0", 1, "Active", 400.0), ("mlx5_1", 1, "Active", None)]
