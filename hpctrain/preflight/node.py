"""All node checks of one node, in the order a person would look.

Runs on local rank 0 of each node inside a job, or on this machine for ``--here``. Returns
plain data (rows plus the facts other checks need, e.g. versions for the cross-node
comparison) so it can travel through the rendezvous store as JSON.
"""

from __future__ import annotations

from pathlib import Path

from . import gpu, infiniband, nccl_env, software, storage, topology
from .results import Check


def checkpoint_folder(profile, run_dir: str | None) -> str:
    if profile.storage.checkpoint_root:
        from ..record.folder import checkpoint_root_folder
        return str(checkpoint_root_folder(profile.storage.checkpoint_root))
    if run_dir:
        from ..record.folder import RunFolder
        return str(RunFolder(Path(run_dir)).checkpoint_dir())
    from ..record.folder import default_runs_root
    return str(default_runs_root(profile.storage.runs_root))


def run_node_checks(profile, *, node: str, nodes: int, run_dir: str | None = None,
                    env: dict | None = None, strict: bool = True, one_host: bool = False,
                    sysfs_ib: str | None = None, progress=None) -> dict:
    """Every node check; returns {"rows": [...dicts], "versions": {...}, "ib_devices": {...}}."""
    say = progress or (lambda msg: None)
    rows: list[Check] = []
    pf = profile.preflight

    say("GPUs")
    if profile.node.device == "cuda":
        gpus, problem = gpu.query_gpus()
        rows += gpu.check_gpus(gpus, problem, profile, node)
        topo, tproblem = topology.read_topology()
        rows += topology.check_topology(topo, tproblem, profile, node)
    else:
        rows += gpu.check_gpus(None, "", profile, node)

    say("InfiniBand")
    ib_devices = None
    if profile.interconnect.kind in ("infiniband", "roce"):
        data = infiniband.collect(sysfs_ib, interval_s=pf.counter_interval_s)
        rows += infiniband.check_infiniband(data, profile, node)
        if data["ports"] is not None:
            ib_devices = {}
            for p in data["ports"]:
                ib_devices.setdefault(p.device, set()).add(p.port)
    else:
        rows += infiniband.check_infiniband({}, profile, node)

    say("NCCL environment")
    env = nccl_env.effective_env(profile, env)
    rows += nccl_env.check_nccl_env(env, profile, ib_devices, nccl_env.list_interfaces(), nodes, node)

    say("storage")
    folder = checkpoint_folder(profile, run_dir)
    rows += storage.check_storage(folder, profile, nodes, node, probe_mb=pf.storage_probe_mb,
                                  checkpoint_bytes=storage.estimate_checkpoint_bytes(run_dir),
                                  one_host=one_host, strict=strict)

    say("software")
    versions = software.local_versions()
    rows += software.check_versions_local(versions, node, profile.node.device)
    return {"node": node, "rows": [r.to_dict() for r in rows], "versions": versions,
            "ib_devices": {k: sorted(v) for k, v in (ib_devices or {}).items()}}
