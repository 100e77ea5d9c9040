"""Rank 0's side of the collective checks, from the timings the ranks report (pure: no
process group). The stories of a real allocation: eight ranks on two nodes where one rank is
slow, a rank that never arrives while another gives up waiting for two, a node slow only next
to the others, a profile without expected bandwidths, a bandwidth exactly at its floor.

Bus bandwidth is nccl-tests' (doc/PERFORMANCE.md): algbw = S / t, busbw = algbw · 2(n-1)/n,
GB = 1e9 bytes; a collective takes as long as its slowest rank.
"""

from __future__ import annotations

import pytest
from helpers import h100_profile

from hpctrain.preflight.bandwidth_rows import (
    group_stats, hang_row, intra_rows, locate_row, world_row)
from hpctrain.preflight.results import ALL_NODES, FAIL, PASS, WARN
from hpctrain.preflight.locate import Locator

MB = 2**20


def _nccl_tests_busbw(size: int, seconds: float, n: int) -> float:
    return size / seconds / 1e9 * 2 * (n - 1) / n


def _timings(group, sizes, seconds_of):
    """Every rank's report: ``seconds_of(rank, size)`` per size."""
    return {r: {"status": "ok", "times": [seconds_of(r, s) for s in sizes]} for r in group}


def _sweep(busbw_gbs: float, n: int, sizes=(MB, 64 * MB)) -> dict:
    """The stats of a healthy ``n``-rank group whose plateau is ``busbw_gbs`` (exactly: the
    bandwidth a floor is compared with)."""
    seconds = {s: s / 1e9 * 2 * (n - 1) / n / busbw_gbs for s in sizes}
    stats = group_stats(list(range(n)), list(sizes), _timings(range(n), sizes,
                                                              lambda r, s: seconds[s]))
    assert stats["rows"][-1]["busbw"] == pytest.approx(busbw_gbs)
    stats["rows"][-1]["busbw"] = busbw_gbs
    return stats


def test_eight_ranks_on_two_nodes_run_at_their_slowest_rank():
    sizes = [MB, 64 * MB]
    # rank 6 (second node) is twice as slow at 64 MB; the others agree
    stats = group_stats(list(range(8)), sizes, _timings(
        range(8), sizes, lambda r, s: (0.004 if r == 6 and s == 64 * MB else 0.002) * s / (64 * MB)))
    assert stats["ok"] and stats["missing"] == [] and stats["silent"] == []
    small, large = stats["rows"]
    assert large["time_us"] == pytest.approx(4000.0)
    assert large["busbw"] == pytest.approx(_nccl_tests_busbw(64 * MB, 0.004, 8))
    assert large["algbw"] == pytest.approx(64 * MB / 0.004 / 1e9)
    assert small["busbw"] == pytest.approx(_nccl_tests_busbw(MB, 0.002 / 64, 8))
    # a pair of nodes with one rank each: busbw = algbw (2·1/2)
    pair = _sweep(20.0, 2)
    assert pair["rows"][-1]["busbw"] == pytest.approx(20.0)
    assert pair["rows"][-1]["algbw"] == pytest.approx(20.0)


def test_a_rank_that_never_arrived_is_blamed_with_those_its_peers_waited_for():
    nodes_of = {r: f"n{r // 4 + 1}" for r in range(8)}
    results = _timings([r for r in range(8) if r != 5], [MB], lambda r, s: 0.001)
    del results[7]        # rank 7's report never came either
    results[2] = {"status": "timeout", "missing": [6, 5], "error": "timed out after 120 s"}
    stats = group_stats(list(range(8)), [MB], results)
    assert not stats["ok"] and stats["rows"] == []
    assert stats["silent"] == [5, 7]                  # never reported
    assert stats["missing"] == [5, 6, 7]              # and those rank 2 waited for
    assert stats["error"] == "timed out after 120 s"
    row = hang_row("world", stats, nodes_of, 120)
    assert (row.node, row.check, row.status) == (ALL_NODES, "collective.world", FAIL)
    assert row.detail["culprits"] == ["n2"] and row.detail["ranks"] == [5, 6, 7]
    assert "rank 5 (n2), rank 6 (n2), rank 7 (n2)" in row.measured
    assert "within 120 s" in row.measured and "n2" in row.fix


def test_every_rank_arrived_but_the_collective_failed_blames_the_fabric():
    results = {r: {"status": "error", "error": f"NCCL error: {'remote' if r else 'local'} "
                   "process exited"} for r in range(4)}
    stats = group_stats(list(range(4)), [MB], results)
    assert not stats["ok"] and stats["missing"] == [] and stats["silent"] == []
    # each distinct message once, in order
    assert stats["error"] == "NCCL error: local process exited; NCCL error: remote process exited"
    row = hang_row("world", stats, {}, 60)
    assert row.status == FAIL and row.detail["culprits"] == [] and row.detail["ranks"] == []
    assert row.measured == f"the all-reduce failed: {stats['error']}"
    assert "fabric" in row.fix
    quiet = hang_row("world", group_stats([0, 1], [MB], {
        r: {"status": "error"} for r in (0, 1)}), {}, 60)
    assert "no rank reported back" in quiet.measured


def test_the_allocation_is_judged_against_the_floor_of_where_its_ranks_are():
    # 360 GB/s in a node, 40 across, half of it to pass
    profile = h100_profile(interconnect={"inter_node_busbw_gbs": 40, "intra_node_busbw_gbs": 360,
                                         "min_bandwidth_fraction": 0.5})
    # two nodes: the inter-node floor, 20 GB/s; exactly at it passes, below it fails
    at_floor = world_row(_sweep(20.0, 16), profile, nodes=2, ranks=16)
    assert at_floor.status == PASS and at_floor.fix == ""
    assert at_floor.expected == ">= 20.0 GB/s (0.5 x 40)"
    below = world_row(_sweep(35.0, 16), h100_profile(), nodes=2, ranks=16)   # 0.8 x 45
    assert below.status == FAIL and "slower than the profile expects" in below.fix
    assert below.measured.startswith("busbw 35.00 GB/s at 64 MB; ")
    # one node: its ranks talk over NVLink, judged against 288 GB/s
    one_node = world_row(_sweep(100.0, 8), profile, nodes=1, ranks=8)
    assert one_node.status == FAIL and one_node.expected == ">= 180.0 GB/s (0.5 x 360)"
    assert world_row(_sweep(180.0, 8), profile, nodes=1, ranks=8).status == PASS


def test_a_profile_without_expected_bandwidths_passes_what_it_measures_and_says_so():
    profile = h100_profile(interconnect={"intra_node_busbw_gbs": None,
                                         "inter_node_busbw_gbs": None})
    row = world_row(_sweep(0.5, 4), profile, nodes=2, ranks=4)
    assert row.status == PASS
    assert row.expected == "not set (interconnect.inter_node_busbw_gbs)"
    assert world_row(_sweep(0.5, 4), profile, nodes=1, ranks=4).expected == \
        "not set (interconnect.intra_node_busbw_gbs)"


def test_one_rank_forms_its_group_with_nothing_to_measure():
    stats = group_stats([0], [256 * 1024], {0: {"status": "ok", "times": [0.0005]}})
    assert stats["rows"][0]["busbw"] == 0.0
    row = world_row(stats, h100_profile(), nodes=1, ranks=1)
    assert row.status == PASS and row.measured.startswith("1 rank: ")
    assert "(500 us at 256 KB)" in row.measured


def test_a_node_slow_next_to_the_others_fails_even_without_expected_bandwidths():
    profile = h100_profile(interconnect={"intra_node_busbw_gbs": None,
                                         "inter_node_busbw_gbs": None})
    per_node = {"n1": _sweep(300.0, 8), "n2": _sweep(150.0, 8), "n3": _sweep(149.0, 8),
                "n4": group_stats([0, 1], [MB], {0: {"status": "ok", "times": [0.001]}})}
    rows = {r.node: r for r in intra_rows(per_node, profile, outlier_fraction=0.5)}
    assert set(rows) == {"n1", "n2", "n3"}           # n4's group failed: its own row elsewhere
    assert rows["n1"].status == PASS and rows["n2"].status == PASS   # exactly half the best
    assert rows["n3"].status == FAIL and "best node 300.00 GB/s" in rows["n3"].expected
    assert "exclude it" in rows["n3"].fix and rows["n2"].fix == ""
    assert all(r.check == "collective.intra_node" for r in rows.values())
    # one node alone is compared with nothing but the profile
    alone = intra_rows({"n3": _sweep(149.0, 8)}, profile, outlier_fraction=0.5)
    assert [r.status for r in alone] == [PASS]


def test_a_node_below_the_profile_s_floor_fails_though_it_is_the_best():
    profile = h100_profile()
    rows = intra_rows({"n1": _sweep(250.0, 8), "n2": _sweep(240.0, 8)}, profile, 0.5)
    assert [r.status for r in rows] == [FAIL, FAIL]
    assert "best node" not in rows[0].expected     # not slow next to the others
    assert [r.node for r in rows] == ["n1", "n2"]


def test_the_locate_row_names_the_culprits_or_says_all_pairs_were_fast():
    found = Locator(["n1", "n2", "n3", "n4"], None, 0.5)
    found.culprits = ["n3"]
    row = locate_row(found, 4)
    assert row.status == FAIL and "n3" in row.measured and "--exclude" in row.fix
    fine = Locator(["n1", "n2", "n3"], None, 0.5)
    fine.culprits, fine.note = [], ""
    row = locate_row(fine, 3)
    assert (row.status, row.measured, row.fix) == (PASS, "all 3 nodes fast in pairs", "")
    fine.note = "every pair is slow: the fabric, not one node"
    row = locate_row(fine, 3)
    assert row.status == WARN and row.measured == fine.note and "fabric" in row.fix


def _gpu_sweep(plateau_gbs: float, n: int) -> dict:
    """A GPU sweep over the default sizes, 1 MB to 1 GB, whose bus bandwidth rises with the
    size to its plateau at the largest (small all-reduces are latency-bound)."""
    sizes = [int(mb * MB) for mb in (1, 4, 16, 64, 256, 1024)]
    share = dict(zip(sizes, (0.1, 0.3, 0.6, 0.8, 0.95, 1.0)))
    stats = group_stats(list(range(n)), sizes, _timings(
        range(n), sizes, lambda r, s: s / 1e9 * 2 * (n - 1) / n / (plateau_gbs * share[s])))
    stats["rows"][-1]["busbw"] = plateau_gbs
    return stats


def test_a_gpu_sweep_is_judged_and_described_at_its_plateau_with_its_latency():
    profile = h100_profile()                  # 0.8 x 45 GB/s across nodes
    stats = _gpu_sweep(40.0, 16)
    busbw = [r["busbw"] for r in stats["rows"]]
    assert busbw == sorted(busbw) and busbw[0] < 36 < busbw[-1]
    row = world_row(stats, profile, nodes=2, ranks=16)
    assert row.status == PASS           # judged at 1 GB, not at a smaller size below the floor
    first_us = stats["rows"][0]["time_us"]
    assert row.measured == f"busbw 40.00 GB/s at 1024 MB; {first_us:.0f} us at 1 MB"
    assert row.detail["sweep"] == stats["rows"]


def test_a_quick_check_of_one_size_names_only_that_size():
    # preflight.sizes_mb: [0.5], a quick check: no latency figure from a second size
    stats = _sweep(12.5, 4, sizes=(MB // 2,))
    row = world_row(stats, h100_profile(), nodes=2, ranks=4)
    assert row.measured == "busbw 12.50 GB/s at 512 KB" and row.status == FAIL


def test_of_two_nodes_the_one_slow_next_to_the_other_fails():
    profile = h100_profile(interconnect={"intra_node_busbw_gbs": None,
                                         "inter_node_busbw_gbs": None})
    rows = intra_rows({"n1": _gpu_sweep(300.0, 8), "n2": _gpu_sweep(100.0, 8)}, profile, 0.5)
    assert [(r.node, r.status) for r in rows] == [("n1", PASS), ("n2", FAIL)]
    assert rows[1].measured.startswith("busbw 100.00 GB/s at 1024 MB; ")
