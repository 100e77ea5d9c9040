"""Everything a rank knows about its run, passed around as one object."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..identity import RankEnv
from .job_env import JobEnv


@dataclass
class RankContext:
    run: object            # hpctrain.record.folder.RunFolder
    job: object            # JobConfig
    profile: object        # ClusterProfile
    layout: object         # config.Layout
    env: RankEnv
    job_env: JobEnv
    attempt: int
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)
    watchdog: object = None    # runtime.watchdog.Watchdog, once started

    def progress(self, phase: str) -> None:
        """A save or load phase began: progress, for the hang watchdog."""
        if self.watchdog is not None:
            self.watchdog.progress(phase=phase)

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_rank0(self) -> bool:
        return self.env.rank == 0

    def layout_record(self) -> dict:
        lay = self.layout
        return {"tp": lay.tensor_model_parallel_size, "pp": lay.pipeline_model_parallel_size,
                "vpp": lay.virtual_pipeline_model_parallel_size, "dp": lay.data_parallel_size,
                "world_size": lay.world_size,
                "distributed_optimizer": bool(self.job.parallel.use_distributed_optimizer),
                "describe": lay.describe()}
