"""Learning-rate schedules: linear warmup, then cosine, WSD, linear or constant to ``min_lr``.

A pure function of the optimizer step, so a resumed run needs only the step to continue
the schedule exactly, and the planner or a plot can evaluate it without torch.

Step ``k`` (0-based: the k-th update) uses:

* warmup (``k < W``): ``lr · (k + 1) / W`` — the first update already moves (Megatron-LM
  starts at 0 and wastes one step);
* then over the remaining ``T - W`` steps, with ``p = (k - W + 1) / (T - W)`` (so the last
  step, ``k = T - 1``, runs at exactly ``min_lr``):
  - cosine: ``min + (lr - min) · ½(1 + cos πp)``
  - linear: ``min + (lr - min) · (1 - p)``
  - constant: ``lr``
  - wsd (warmup-stable-decay): ``lr`` until the last ``D`` steps (``wsd_decay_steps``,
    default 10% of the run), then a cosine from ``lr`` to ``min`` over those ``D`` steps.

Steps past ``T`` stay at ``min_lr`` (constant: ``lr``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

STYLES = ("cosine", "wsd", "linear", "constant")


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    min_lr: float
    total_steps: int
    warmup_steps: int = 0
    style: str = "cosine"
    wsd_decay_steps: int | None = None

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"unknown schedule {self.style!r}; expected one of {', '.join(STYLES)}")

    @classmethod
    def from_train(cls, train) -> "LRSchedule":
        """From a job's ``train`` section."""
        return cls(lr=train.lr, min_lr=train.min_lr, total_steps=train.steps,
                   warmup_steps=train.warmup_steps, style=train.schedule,
                   wsd_decay_steps=train.wsd_decay_steps)

    @property
    def decay_steps(self) -> int:
        """wsd: length of the final decay."""
        after_warmup = max(0, self.total_steps - self.warmup_steps)
        if self.wsd_decay_steps is not None:
            return max(0, min(self.wsd_decay_steps, after_warmup))
        return max(1, round(0.1 * self.total_steps)) if after_warmup else 0

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.style == "constant":
            return self.lr
        span = self.total_steps - self.warmup_steps
        if self.style == "wsd":
            decay = self.decay_steps
            start = self.total_steps - decay
            if step < start:
                return self.lr
            progress = 1.0 if decay == 0 else min(1.0, (step - start + 1) / decay)
            return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
        progress = 1.0 if span <= 0 else min(1.0, (step - self.warmup_steps + 1) / span)
        if self.style == "linear":
            return self.min_lr + (self.lr - self.min_lr) * (1 - progress)
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))

    def state_dict(self) -> dict:
        return asdict(self)
