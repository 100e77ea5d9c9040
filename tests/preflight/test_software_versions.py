"""Preflight's software rows: torch, Transformer Engine and megatron-core must fit together.

The check reads installed package metadata. Each test builds a node's site-packages from
``.dist-info`` folders (megatron-core's is derived from its real wheel, see SOURCES.md) and
points the reader, or ``HPCTRAIN_TEST_SITE_PACKAGES``, at it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.preflight import software
from hpctrain.preflight.software import InstalledPackages, check_versions_local, local_versions
from tests.preflight.helpers import FIXTURES

GPU_NODE = FIXTURES / "site_packages" / "gpu-node"
MEGATRON_DIST = GPU_NODE / "megatron_core-0.16.1.dist-info"


def node_packages(root: Path, *, torch: str | None = "2.10.0a0+b4e4ee81d3",
                  te: str | None = "2.10.0+769ed77", megatron: str | None = "0.16.1") -> Path:
    """A node's site-packages with these versions (None: not installed)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, version in (("torch", torch), ("transformer_engine", te)):
        if version:
            d = root / f"{name}-{version}.dist-info"
            d.mkdir()
            (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if megatron:
        d = root / f"megatron_core-{megatron}.dist-info"
        shutil.copytree(MEGATRON_DIST, d)
        meta = d / "METADATA"
        meta.write_text(meta.read_text().replace("Version: 0.16.1", f"Version: {megatron}"))
    return root


def rows_for(root: Path, device: str = "cuda") -> dict:
    packages = InstalledPackages([str(root)])
    versions = local_versions(packages=packages, run_smi=False)
    rows = check_versions_local(versions, "n1", device, software.megatron_requirements(packages))
    return {r.check: r for r in rows}


def test_requirements_are_read_from_megatron_cores_metadata():
    from_wheel = software.megatron_requirements(InstalledPackages([str(GPU_NODE)]))
    assert from_wheel == {"torch": ">=2.6.0", "transformer-engine": ">=2.9.0a0,<2.12.0"}
    # the fallbacks (megatron-core unreadable) are what 0.16.1 declares, and so is this machine's
    assert from_wheel == {"torch": software.MEGATRON_TORCH_SPEC,
                          "transformer-engine": software.MEGATRON_TE_SPEC}
    assert software.megatron_requirements(InstalledPackages()) == from_wheel


def test_a_gpu_node_with_fitting_versions_passes(tmp_path):
    rows = rows_for(node_packages(tmp_path / "sp"))
    assert {k: r.status for k, r in rows.items()} == {
        "software.megatron": "pass", "software.torch": "pass", "software.transformer_engine": "pass"}


@pytest.mark.parametrize("torch, why", [
    ("2.6.0a0+ecf3bae", "below megatron-core's minimum"),   # a pre-release of 2.6 (NGC 24.12/25.01 kind)
    ("2.5.1", "below megatron-core's minimum"),
    ("2.9.1+cpu", "a CPU-only build"),
])
def test_torch_that_megatron_core_cannot_use_fails_with_the_fix(tmp_path, torch, why):
    row = rows_for(node_packages(tmp_path / "sp", torch=torch))["software.torch"]
    assert row.status == "fail" and row.measured == f"{torch} ({why})"
    assert "examples/container/Dockerfile" in row.fix


def test_torch_missing_fails(tmp_path):
    row = rows_for(node_packages(tmp_path / "sp", torch=None))["software.torch"]
    assert row.status == "fail" and row.measured == "not installed"


@pytest.mark.parametrize("te", ["1.13.0+e5edd6c", "2.8.0", "2.12.0+5671fd36", "3.0.0"])
def test_transformer_engine_outside_megatron_cores_range_fails(tmp_path, te):
    row = rows_for(node_packages(tmp_path / "sp", te=te))["software.transformer_engine"]
    assert row.status == "fail"
    assert row.measured == f"{te} (outside megatron-core's range)"
    assert ">=2.9.0a0,<2.12.0" in row.expected and "transformer-engine[pytorch]" in row.fix


@pytest.mark.parametrize("te", ["2.9.0", "2.9.0rc1", "2.11.0+abc"])
def test_transformer_engine_inside_the_range_passes(tmp_path, te):
    assert rows_for(node_packages(tmp_path / "sp", te=te))["software.transformer_engine"].status \
        == "pass"


def test_transformer_engine_is_required_on_cuda_only(tmp_path):
    root = node_packages(tmp_path / "sp", te=None, torch="2.9.1+cpu")
    cuda = rows_for(root, "cuda")
    assert cuda["software.transformer_engine"].status == "fail"
    assert cuda["software.transformer_engine"].measured == "not installed"
    cpu = rows_for(root, "cpu")
    assert "software.transformer_engine" not in cpu      # the CPU rehearsal runs the local spec
    assert cpu["software.torch"].status == "pass"        # a CPU torch is right for it


def test_megatron_core_other_than_the_validated_one_fails(tmp_path):
    row = rows_for(node_packages(tmp_path / "sp", megatron="0.15.0"))["software.megatron"]
    assert row.status == "fail" and row.measured == "0.15.0"
    assert "pip install --no-deps megatron-core==0.16.1" in row.fix


def test_nodes_with_different_transformer_engines_are_blamed():
    v = {"torch": "2.10.0a0", "transformer-engine": "2.10.0", "megatron-core": "0.16.1"}
    rows = {r.check: r for r in software.compare_versions(
        {"n1": v, "n2": v, "n3": {**v, "transformer-engine": "2.9.0"}})}
    te = rows["software.transformer-engine"]
    assert te.status == "fail" and te.measured == "n3: 2.9.0" and te.detail["culprits"] == ["n3"]


def _run_main(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HPCTRAIN_TEST_SITE_PACKAGES": str(root)}
    return subprocess.run([sys.executable, "-m", "hpctrain.preflight.software", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_module_entry_point_is_a_container_build_gate(tmp_path):
    good = _run_main(node_packages(tmp_path / "good"))
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _run_main(node_packages(tmp_path / "bad", torch="2.6.0a0+df5bbc0", te="1.13.0"))
    assert bad.returncode == 1
    assert "FAIL  software.torch" in bad.stdout and "FAIL  software.transformer_engine" in bad.stdout
    assert "fix: megatron-core needs torch>=2.6.0" in bad.stdout
    assert "Traceback" not in bad.stderr
