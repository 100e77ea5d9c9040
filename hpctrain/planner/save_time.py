"""How long a layout's checkpoint save blocks training, and the checkpoint interval it leads to.

The runtime measures δ on every save; before a job runs, ``hpctrain plan`` estimates it from
the planner's bytes (``save_memory``: what each rank hands the writer) and the profile:

* every save pays ``SAVE_OVERHEAD_S`` (planning, barriers, manifest, rename: the runtime's own
  guess, ``SaveEstimate.GUESS_OVERHEAD_S``) and, with ``fully_reshardable``, the rebuild of the
  optimizer state: an all-gather over the DP group at the profile's bus bandwidth (not counted
  when the profile gives none), and its re-assembly in host memory at ``REBUILD_GBS``;
* a synchronous save then writes the node's share (its ranks' bytes together) at
  ``storage.write_bandwidth_gbs`` per node (``DEFAULT_WRITE_GBS`` when the profile says
  nothing: a conservative figure for a shared parallel file system seen from one node);
* a background save (``checkpoint.async_save``, the default) blocks only while each rank
  copies its share to host memory, at ``HOST_COPY_GBS`` (every GPU of a node copies over its
  own link); the write then overlaps training.

``HOST_COPY_GBS`` and ``REBUILD_GBS`` are measured, not datasheet figures: on one H200
(``tools/gpu_check``, README "GPU check"), a dp_reshardable background save of 13.3 GB blocked
training 9.8 s (≈ 3 s + 13.3 GB at 2 GB/s), and fully_reshardable's rebuild of 11.4 GB of
optimizer state added about 52 s more (≈ 0.22 GB/s).

δ is the background save's blocking time when ``async_save`` is on, else the synchronous save's.
The interval follows from :mod:`hpctrain.checkpoint_interval` with the profile's
``reliability.node_mtbf_hours`` and the layout's node count.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint_interval import IntervalEstimate, estimate
from .save_memory import SaveMemory

SAVE_OVERHEAD_S = 3.0
DEFAULT_WRITE_GBS = 2.0
HOST_COPY_GBS = 2.0
REBUILD_GBS = 0.22
# Recovery after a failure re-reads the checkpoint: R = what a rank loads / RESUME_READ_GBS.
# Measured: an H100's resume of the check model's 13.3 GB took 8.8 s from /dev/shm
# (tools/gpu_check, before the parallel verify-as-you-read loader); gpu_check's resume row
# measures the loader that runs now.
RESUME_READ_GBS = 1.5


@dataclass(frozen=True)
class SaveTime:
    """One save of a layout, on its most loaded rank and node."""

    bytes_per_rank: int
    bytes_per_node: int
    write_gbs: float
    write_assumed: bool        # storage.write_bandwidth_gbs unset: DEFAULT_WRITE_GBS
    gather_s: float            # fully_reshardable's rebuild: all-gather + copy to host
    gather_link_known: bool    # False: the all-gather itself not counted (no bandwidth)
    write_s: float
    copy_s: float
    background: bool

    @property
    def sync_s(self) -> float:
        return SAVE_OVERHEAD_S + self.gather_s + self.write_s

    @property
    def blocking_s(self) -> float:
        if self.background:
            return SAVE_OVERHEAD_S + self.gather_s + self.copy_s
        return self.sync_s

    def source(self) -> str:
        how = (f"{SAVE_OVERHEAD_S:g} s + copy to host at {HOST_COPY_GBS:g} GB/s" if self.background
               else f"{SAVE_OVERHEAD_S:g} s + write at {self.write_gbs:g} GB/s per node")
        return "plan: " + how + (" + optimizer gather" if self.gather_s else "")

    def to_json(self) -> dict:
        return {"bytes_per_rank": self.bytes_per_rank, "bytes_per_node": self.bytes_per_node,
                "write_bandwidth_gbs": self.write_gbs, "write_bandwidth_assumed": self.write_assumed,
                "optimizer_gather_s": round(self.gather_s, 3),
                "optimizer_gather_bandwidth_known": self.gather_link_known,
                "write_s": round(self.write_s, 3), "host_copy_s": round(self.copy_s, 3),
                "background": self.background, "blocking_s": round(self.blocking_s, 3),
                "synchronous_s": round(self.sync_s, 3)}


def save_time(save: SaveMemory, *, dp: int, dp_link_gbs: float | None,
              write_gbs: float | None, background: bool,
              ranks_per_node: int | None = None) -> SaveTime:
    """The time of ``save`` (the planner's :class:`SaveMemory` of a layout)."""
    per_rank = save.async_copy_per_rank
    per_node = per_rank * (ranks_per_node or save.ranks_per_node)
    bandwidth = write_gbs or DEFAULT_WRITE_GBS
    gathered = save.gathered_per_rank
    gather = gathered / (REBUILD_GBS * 1e9)
    if gathered and dp > 1 and dp_link_gbs:
        gather += gathered * (dp - 1) / dp / (dp_link_gbs * 1e9)
    return SaveTime(per_rank, per_node, bandwidth, write_gbs is None, gather,
                    not (gathered and dp > 1) or bool(dp_link_gbs),
                    per_node / (bandwidth * 1e9), per_rank / (HOST_COPY_GBS * 1e9), background)


@dataclass(frozen=True)
class Checkpointing:
    """A layout's save time and its checkpoint interval: the job's, and Young/Daly's."""

    save: SaveTime
    job: IntervalEstimate           # what the job's checkpoint settings give
    auto: IntervalEstimate          # what interval_minutes: auto would choose
    setting: str                    # the job's settings, in words

    def to_json(self) -> dict:
        return {"save_time": self.save.to_json(), "setting": self.setting,
                "job": self.job.to_json(), "young_daly": self.auto.to_json()}


def job_interval_s(interval_minutes, interval_steps: int, step_s: float | None) -> float | None:
    """The work between periodic saves the job's fixed settings give (None: no periodic
    saves; either setting triggers a save, so the shorter one counts)."""
    candidates = []
    if interval_minutes not in ("auto", None) and interval_minutes > 0:
        candidates.append(60.0 * interval_minutes)
    if interval_steps and step_s:
        candidates.append(interval_steps * step_s)
    return min(candidates) if candidates else None


def checkpointing(save: SaveMemory, *, dp: int, dp_link_gbs: float | None,
                  write_gbs: float | None, background: bool, node_mtbf_hours: float, nodes: int,
                  interval_minutes, interval_steps: int, step_s: float | None,
                  ranks_per_node: int | None = None) -> Checkpointing:
    st = save_time(save, dp=dp, dp_link_gbs=dp_link_gbs, write_gbs=write_gbs,
                   background=background, ranks_per_node=ranks_per_node)
    restart = st.bytes_per_rank / (RESUME_READ_GBS * 1e9)
    auto = estimate(st.blocking_s, node_mtbf_hours, nodes, delta_source=st.source(),
                    restart_s=restart)
    words = []
    if interval_minutes == "auto":
        words.append("interval_minutes auto")
    elif interval_minutes:
        words.append(f"interval_minutes {interval_minutes:g}")
    if interval_steps:
        words.append(f"interval_steps {interval_steps}")
    setting = ", ".join(words) or "no periodic saves"
    if interval_minutes == "auto":
        fixed = job_interval_s(None, interval_steps, step_s)
        job = auto if fixed is None or fixed >= auto.interval_s else estimate(
            st.blocking_s, node_mtbf_hours, nodes, delta_source=st.source(), interval_s=fixed,
            restart_s=restart)
    else:
        job = estimate(st.blocking_s, node_mtbf_hours, nodes, delta_source=st.source(),
                       interval_s=job_interval_s(interval_minutes, interval_steps, step_s) or 0.0,
                       restart_s=restart)
    return Checkpointing(st, job, auto, setting)
