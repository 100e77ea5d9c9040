"""Health in flight: hung ranks and straggler nodes, seen while training runs.

Pure, torch-free modules shared by the ranks (``hpctrain.runtime.watchdog``,
``hpctrain.runtime.straggler_timing``), the batch shell's watcher
(``hpctrain.scheduler.slurm.hang_watch``) and the CLI:

* ``heartbeat`` — the file every rank's side thread rewrites every few seconds
  (``logs/attempt-N/heartbeat/rank-R.json``): step, phase, when it last made progress, the
  collectives it issued per process group;
* ``hang`` — when a job is hung, which rank stopped first, and the verdict (``hang.json``);
* ``stragglers`` — which node's ranks compute slower than the median, interval after interval.
"""
