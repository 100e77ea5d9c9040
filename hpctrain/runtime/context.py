"""Everything a rank knows about its run, passed around as one object."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import ClusterProfile, JobConfig, Layout
from ..identity import RankEnv
from ..record.folder import RunFolder
from .job_env import JobEnv
from .watchdog import Watchdog


@dataclass
class RankContext:
    run: RunFolder
    job: JobConfig
    profile: ClusterProfile
    layout: Layout
    env: RankEnv
    job_env: JobEnv
    attempt: int
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)
    watchdog: Watchdog | None = None    # once started

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
