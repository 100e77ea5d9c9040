"""Runners with fake `nvidia-smi`/`ibstat` on PATH, and `hpctrain preflight --here` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.preflight import gpu, topology
from hpctrain.preflight.node import run_node_checks
from tests.preflight.helpers import FIXTURES, h100_profile, write_executable

HCAS = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]


def _statuses(result):
    return {r["check"]: r["status"] for r in result["rows"]}


def _profile(tmp_path, **over):
    return h100_profile(storage={"checkpoint_root": str(tmp_path / "ck"), "min_free_gb": 0.001},
                        preflight={"storage_probe_mb": 1, "counter_interval_s": 0},
                        env={"NCCL_IB_HCA": ",".join(HCAS)}, **over)


def test_healthy_node_through_fake_tools(fake_tools, tmp_path):
    fake_tools(query="query_gpu/h100x8-health.csv", topo="topo/h100-8gpu-8nic.txt",
               ibstat="ibstat/h100-all-active.txt")
    result = run_node_checks(_profile(tmp_path), node="n1", nodes=1)
    st = _statuses(result)
    for check in ("gpu.count", "gpu.ecc", "gpu.clocks", "topology.nvlink", "ib.hcas", "ib.ports",
                  "ib.rate", "nccl.ib_hca", "nccl.ib_disable", "storage.writable",
                  "software.megatron", "software.torch", "software.transformer_engine"):
        assert st[check] == "pass", (check, result["rows"])
    assert result["ib_devices"]["mlx5_9"] == [1]


def test_degraded_node_through_fake_tools(fake_tools, tmp_path):
    fake_tools(query="query_gpu/h100x8-health-degraded.csv", topo="topo/h100-gpu3-nvlink-down.txt",
               ibstat="ibstat/h100-port-down.txt")
    st = _statuses(run_node_checks(_profile(tmp_path), node="n1", nodes=1))
    assert st["gpu.ecc"] == st["gpu.clocks"] == st["topology.nvlink"] == st["ib.ports"] == "fail"
    assert st["ib.rate"] == "pass"


def test_missing_tools_give_rows_not_tracebacks(fake_tools, tmp_path):
    fake_tools()  # neither tool on PATH, no sysfs
    rows = {r["check"]: r for r in run_node_checks(_profile(tmp_path), node="n1", nodes=1)["rows"]}
    assert rows["gpu.count"]["status"] == "fail" and "not on PATH" in rows["gpu.count"]["measured"]
    assert rows["topology"]["status"] == "warn"
    assert rows["ib.hcas"]["status"] == "fail" and "infiniband-diags" in rows["ib.hcas"]["fix"]
    assert rows["nccl.ib_hca"]["status"] == "warn"  # cannot verify without the HCA list


def test_sysfs_fallback_when_ibstat_is_missing(fake_tools, tmp_path, monkeypatch):
    fake_tools(query="query_gpu/h100x8-health.csv", topo="topo/h100-8gpu-8nic.txt")
    monkeypatch.setenv("HPCTRAIN_TEST_SYSFS_IB", str(FIXTURES / "sysfs_ib" / "h100"))
    profile = _profile(tmp_path, interconnect={"hcas": ["mlx5_0", "mlx5_1"]})
    rows = {r["check"]: r for r in run_node_checks(profile, node="n1", nodes=1)["rows"]}
    assert rows["ib.hcas"]["status"] == "pass" and "(sysfs)" in rows["ib.hcas"]["measured"]


def test_query_retries_without_a_field_the_driver_rejects(fake_tools):
    fake_tools(query="query_gpu/a100x8.csv", reject_field="remapped_rows.pending")
    rows, problem = gpu.query_gpus()
    assert problem == "" and len(rows) == 8


def test_a_driver_that_knows_the_clock_reasons_only_by_their_new_name(tmp_path, monkeypatch):
    """A driver that refuses ``clocks_throttle_reasons.active`` (nvidia-smi's own words) but
    answers ``clocks_event_reasons.active``: the runner asks again under the new name, so the
    GPU's clock slowdown is still read, not dropped with the old name."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # the fake answers the asked fields only, from the real capture (which has the new name)
    write_executable(bindir / "nvidia-smi", f"""#!{sys.executable}
import csv, sys
asked = sys.argv[1].split("=", 1)[1].split(",")
if "clocks_throttle_reasons.active" in asked:
    print('Field "clocks_throttle_reasons.active" is not a valid field to query.')
    sys.exit(2)
rows = list(csv.reader(open({str(FIXTURES / "query_gpu" / "h100x1-real.csv")!r}), skipinitialspace=True))
names = [h.split(" [")[0] for h in rows[0]]
for row in rows:
    print(", ".join(row[names.index(f)] for f in asked))
""")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}/usr/bin:/bin")
    rows, problem = gpu.query_gpus()
    assert problem == "" and rows[0]["clocks_event_reasons.active"] == "0x0000000000000001"
    assert "persistence_mode" in rows[0]   # the fields after it are asked too
    checks = {c.check: c for c in gpu.check_gpus(rows, problem, h100_profile(
        slurm={"gpus_per_node": 1}, node={"gpus": 1}), "n1")}
    assert checks["gpu.clocks"].status == "pass"


def test_topology_runner_reports_a_broken_nvidia_smi(fake_tools):
    fake_tools(query="query_gpu/a100x8.csv")  # knows no `topo`
    topo, problem = topology.read_topology()
    assert topo is None and "exited with 9" in problem


def _profile_file(tmp_path, ibstat_ok=True):
    text = f"""
name: ib-test
scheduler: slurm
slurm: {{nodes: 1, gpus_per_node: 8, exclusive: true}}
node: {{gpus: 8, gpu_model: H100, device: cuda}}
env: {{NCCL_IB_HCA: "{','.join(HCAS)}"}}
interconnect: {{kind: infiniband, hcas: [{', '.join(HCAS)}], port_rate_gbps: 400,
               link_layer: InfiniBand}}
storage: {{checkpoint_root: {tmp_path / 'ck'}, min_free_gb: 0.001}}
preflight: {{storage_probe_mb: 1, counter_interval_s: 0}}
"""
    path = tmp_path / "ib-test.yaml"
    path.write_text(text)
    return str(path)


def test_cli_here_exit_codes_and_json(fake_tools, tmp_path):
    fake_tools(query="query_gpu/h100x8-health.csv", topo="topo/h100-8gpu-8nic.txt",
               ibstat="ibstat/h100-all-active.txt")
    runner = CliRunner()
    ok = runner.invoke(cli, ["preflight", "--here", "--profile", _profile_file(tmp_path), "--json"])
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.output)
    assert report["passed"] and report["mode"] == "here"

    fake_tools(query="query_gpu/h100x8-health.csv", topo="topo/h100-8gpu-8nic.txt",
               ibstat="ibstat/h100-rate-100.txt")
    bad = runner.invoke(cli, ["preflight", "--here", "--profile", _profile_file(tmp_path)])
    assert bad.exit_code == 1
    assert "FAIL  ib.rate" in bad.output and "mlx5_6:1 at 100 Gb/s" in bad.output
    assert "fix: the link trained below its speed" in bad.output


def test_cli_bad_input_is_exit_2_without_traceback(tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["preflight", "--here", "--profile", "no-such-profile"])
    assert res.exit_code == 2 and "unknown profile 'no-such-profile'" in res.output
    assert "Traceback" not in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("interconnect: {kind: infiniband, hcas: ['mlx5_0; rm -rf /']}\n"
                   "preflight: {outlier_fraction: 3}\n")
    res = runner.invoke(cli, ["preflight", "--here", "--profile", str(bad)])
    assert res.exit_code == 2
    assert "interconnect.hcas[0]" in res.output and "preflight.outlier_fraction" in res.output


def test_help_and_here_do_not_import_torch(tmp_path):
    code = ("import sys; from hpctrain.cli import main\n"
            "try:\n    main(['preflight', '--help'])\nexcept SystemExit: pass\n"
            "try:\n    main(['preflight', '--here', '--profile', 'dev-slurm', '--json'])\n"
            "except SystemExit: pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'megatron') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
