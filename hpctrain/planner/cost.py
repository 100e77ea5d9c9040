"""What training a job costs on a layout: time to train ``train.steps`` and GPU-hours.

Both follow from the planner's estimated step time (``timing``) and nothing else: the time is
``train.steps`` × the step time, the GPU-hours that time × every GPU of the layout
(TP × PP × DP), whether or not a GPU is busy in the pipeline bubble (the allocation is paid
for either way). Checkpoint saves, restarts after preemption and the queue are not counted:
the estimate is the floor, ``hpctrain status`` says what a run really used.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingCost:
    steps: int
    gpus: int
    time_s: float | None          # None: no step time estimated (no peak TFLOP/s known)

    @property
    def gpu_hours(self) -> float | None:
        return None if self.time_s is None else self.time_s * self.gpus / 3600

    def to_json(self) -> dict:
        return {"steps": self.steps, "time_to_train_s": self.time_s,
                "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 4)}


def training_cost(step_time_s: float | None, steps: int, gpus: int) -> TrainingCost:
    return TrainingCost(steps, gpus, None if step_time_s is None else step_time_s * steps)
