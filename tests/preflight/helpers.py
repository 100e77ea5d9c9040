"""Helpers for the preflight tests: fixture files, small profiles, fake tool scripts."""

from __future__ import annotations

import stat
from pathlib import Path

from hpctrain.config import profile_from_mapping

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "preflight"


def fixture_text(rel: str) -> str:
    return (FIXTURES / rel).read_text()


def make_profile(**sections):
    """A validated profile from a few sections (the rest default)."""
    return profile_from_mapping({"name": "t", "scheduler": "slurm", **sections}, "test profile")


def h100_profile(**overrides):
    base = {"slurm": {"nodes": 2, "gpus_per_node": 8, "exclusive": True},
            "node": {"gpus": 8, "gpu_model": "H100", "device": "cuda"},
            "interconnect": {"kind": "infiniband", "hcas": ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5",
                                                            "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"],
                             "port_rate_gbps": 400, "link_layer": "InfiniBand",
                             "intra_node_busbw_gbs": 360, "inter_node_busbw_gbs": 45}}
    for k, v in overrides.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return make_profile(**base)


def write_executable(path: Path, text: str) -> None:
    path.write_text(text + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
