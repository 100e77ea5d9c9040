"""`hpctrain bench scaling` end to end on the dev Slurm cluster: real submissions at 1 and 2
nodes, tokens/s read from each run's metrics, efficiency against the smallest size, a PNG.
The efficiency's value depends on this machine (CPU ranks sharing two cores): only its
arithmetic is checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config import yamlio
from hpctrain.record.folder import find_run
from tests.conftest import REPO, hpctrain
from tests.runtime.helpers import TINY_MODEL

pytestmark = [pytest.mark.slurm, pytest.mark.megatron]
WARMUP = 3


def tiny_dp_job(folder: Path) -> Path:
    """The runtime tests' tiny GPT, TP1×PP1 (data parallel only), 2 sequences per rank."""
    job = {"name": "scale-tiny", "model": dict(TINY_MODEL),
           "parallel": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1},
           "batch": {"micro_batch_size": 2, "global_batch_size": 8},
           "train": {"steps": 100, "lr": 3e-3, "warmup_steps": 2, "init_timeout_s": 120},
           "data": {"path": str(REPO / "examples" / "data" / "kjv_byte"),
                    "prepare_from": [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]},
           "checkpoint": {"interval_steps": 50}}
    path = folder / "scale-tiny.yaml"
    yamlio.write_atomic(path, yamlio.dump(job))
    return path


def throughput(metrics: list[dict]) -> float:
    """tokens/s over the steps after the warm-up, from the run's own records."""
    steps = {m["step"]: m for m in metrics}
    kept = [steps[s] for s in sorted(steps) if s > WARMUP]
    return sum(m["tokens_per_s"] * m["step_time_s"] for m in kept) / \
        sum(m["step_time_s"] for m in kept)


def test_weak_scaling_on_one_and_two_nodes(slurm_cluster, tmp_path):
    runs = tmp_path / "runs"
    proc = hpctrain("bench", "scaling", str(tiny_dp_job(tmp_path)), "-p", "dev-slurm",
                    "--nodes", "1,2", "--steps", "8", "--warmup", str(WARMUP),
                    env={"HPCTRAIN_RUNS_DIR": str(runs)}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    written = proc.stdout.split("Written: ")[1].split(", ")
    result = json.loads(Path(written[0]).read_text())
    png = Path(written[1].strip())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    one, two = result["sizes"]
    assert (one["nodes"], one["world_size"], two["nodes"], two["world_size"]) == (1, 2, 2, 4)
    # weak scaling: 2 sequences per rank at every size
    assert (one["global_batch_size"], two["global_batch_size"]) == (4, 8)
    for size in (one, two):
        run = find_run(size["run"], runs)
        assert run.meta()["scheduler"] == "slurm" and size["job_id"] in run.job_ids()
        assert size["outcome"] == "finished" and size["steps_measured"] == 8 - WARMUP
        assert size["tokens_per_s"] == pytest.approx(throughput(run.metrics()), rel=1e-3)
        job = run.resolved_job()
        assert job.train.steps == 8 and job.checkpoint.interval_steps == 0
        assert not list(run.checkpoint_dir().glob("step-*"))      # throughput, not saves
    assert one["efficiency"] == 1.0
    per_rank = [s["tokens_per_s"] / s["world_size"] for s in (one, two)]
    assert two["efficiency"] == pytest.approx(per_rank[1] / per_rank[0], abs=1e-3)
    # the planner (calibrated on the 1-node run: dev-slurm has no peak TFLOP/s) beside it
    assert one["predicted_step_time_s"] == pytest.approx(one["step_time_s"], rel=1e-3)
    assert two["predicted_efficiency"] is not None
    table = proc.stdout.split("Weak scaling of scale-tiny on dev-slurm")[1]
    rows = [ln.split() for ln in table.splitlines()[2:4]]
    assert [r[:3] for r in rows] == [["1", "2", "TP1×PP1×DP2"], ["2", "4", "TP1×PP1×DP4"]]
    assert "target: more than 85% efficiency" in table
