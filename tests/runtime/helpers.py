"""Run folders for runtime tests: a tiny GPT on the real example corpus, any layout."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hpctrain.config import job_from_mapping, profile_from_mapping, yamlio
from hpctrain.config.schema import to_dict
from hpctrain.record.folder import RunFolder
from tests.conftest import REPO

CORPUS = REPO / "examples" / "corpus" / "kjv.txt.gz"

# Small enough that a 4-rank step takes a fraction of a second on 2 cores, big enough to
# exercise every parallel dimension (4 layers: PP2 × VPP2 chunks of one layer).
TINY_MODEL = dict(num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                  vocab_size=257, make_vocab_size_divisible_by=64, seq_length=32)

LAYOUTS = {
    "single": dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1),
    "tp2pp2": dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2),
    "tp2pp2vpp2": dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                       virtual_pipeline_model_parallel_size=2),
    "pp2vpp2dp2_zero1": dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                             use_distributed_optimizer=True),
    "tp2dp2_zero1": dict(tensor_model_parallel_size=2, use_distributed_optimizer=True),
    "pp2dp2_zero1": dict(pipeline_model_parallel_size=2, use_distributed_optimizer=True),
    "dp2_zero1": dict(use_distributed_optimizer=True),
    "tp2": dict(tensor_model_parallel_size=2),
    "single_zero1": dict(use_distributed_optimizer=True),
    "tp2_zero1": dict(tensor_model_parallel_size=2, use_distributed_optimizer=True),
    "dp4": dict(),
}
WORLD = {"single": 1, "tp2": 2, "dp2_zero1": 2, "single_zero1": 1, "tp2_zero1": 2}


def world_of(layout: str) -> int:
    return WORLD.get(layout, 4)


def job_mapping(data_prefix: str, layout: str = "single", steps: int = 12, **sections) -> dict:
    job = {
        "name": f"tiny-{layout}",
        "model": dict(TINY_MODEL),
        "parallel": dict(LAYOUTS[layout]),
        "batch": {"micro_batch_size": 2, "global_batch_size": 16},
        "train": {"steps": steps, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 3,
                  "schedule": "cosine", "seed": 1234, "log_interval": 1, "init_timeout_s": 60},
        "data": {"path": str(data_prefix)},
        "checkpoint": {"interval_steps": 0, "interval_minutes": 0, "keep_last": 3,
                       "async_save": False, "save_at_end": True},
    }
    for section, values in sections.items():
        job.setdefault(section, {})
        job[section].update(values)
    return job


def local_profile(world: int, **changes) -> dict:
    data = yamlio.read_mapping(REPO / "cluster_profiles" / "local.yaml")
    data = copy.deepcopy(data)
    data["slurm"]["gpus_per_node"] = world
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    return data


def make_run(root: Path, name: str, job: dict, world: int, profile: dict | None = None) -> RunFolder:
    """A run folder as ``hpctrain submit`` leaves it: job.yaml and profile.yaml resolved."""
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=False)
    run = RunFolder(path)
    parsed = job_from_mapping(job, f"{name}/job.yaml")
    prof = profile_from_mapping(profile or local_profile(world), f"{name}/profile.yaml", "local")
    yamlio.write_atomic(run.job_file, yamlio.dump(to_dict(parsed)))
    yamlio.write_atomic(run.profile_file, yamlio.dump(to_dict(prof)))
    run.update_meta(name=name, profile=prof.name)
    return run


def losses(run: RunFolder) -> dict[int, float]:
    """step -> loss from metrics.jsonl (the last record of a step wins: a resumed attempt)."""
    out = {}
    for rec in run.metrics():
        out[rec["step"]] = rec["loss"]
    return out


def result(run: RunFolder, attempt: int) -> dict:
    return json.loads((run.attempt_dir(attempt) / "result.json").read_text())


def tensor_write_item(name: str, tensor):
    """torch's distributed-checkpoint WriteItem for the whole of ``tensor`` under ``name`` (a
    one-chunk tensor, as a save's planner makes it), for tests of the checkpoint writer."""
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                       TensorProperties)
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
    return WriteItem(index=MetadataIndex(name, (0,)), type=WriteItemType.TENSOR,
                     tensor_data=TensorWriteData(ChunkStorageMetadata((0,), tensor.shape),
                                                 TensorProperties(dtype=tensor.dtype),
                                                 tensor.shape))


def rank_context(root: Path, name: str, job: dict, world: int, rank: int = 0,
                 profile: dict | None = None, attempt: int = 1):
    """The ``RankContext`` rank ``rank`` of a ``world``-rank attempt builds on a new run folder
    (no process group: for what a rank does on its own)."""
    from hpctrain.identity import RankEnv
    from hpctrain.runtime.context import RankContext
    from hpctrain.runtime.entry import resolve_layout
    from hpctrain.runtime.job_env import JobEnv
    run = make_run(root, name, job, world, profile)
    job, prof = run.resolved_job(), run.resolved_profile()
    env = RankEnv(rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                  master_addr="127.0.0.1", master_port=1, launcher="test")
    jenv = JobEnv(run_dir=str(run.path), attempt=attempt, deadline=None, preempt_signal=None,
                  signal_flag=None, log_to_file=False, local_executor=False, local_job_id=None)
    return RankContext(run=run, job=job, profile=prof, layout=resolve_layout(job, prof, world),
                       env=env, job_env=jenv, attempt=attempt, device="cpu")
