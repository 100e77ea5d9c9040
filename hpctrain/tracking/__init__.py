"""Experiment trackers (Weights & Biases, MLflow): one hpctrain run is one tracker run.

Why this shape:

- **One tracker run across every attempt.** The tracker's run id is kept in the run folder
  (``tracking/state.json``), so a requeued, chained or resumed attempt continues the same W&B /
  MLflow run instead of starting a new one.
- **Each step once, as finally trained.** Steps trained after the newest checkpoint are trained
  again after a preemption or a crash, and neither tracker can take a logged point back (W&B
  ignores a step logged twice or out of order; MLflow keeps both values). So the tracker is sent
  a step only once a checkpoint holding it is published (or the run finished): rank 0 buffers
  the log records and flushes them up to the step of each new checkpoint. The log line,
  ``metrics.jsonl`` and TensorBoard stay live; the tracker trails by at most one checkpoint
  interval.
- **Never slows or stops training.** Rank 0 hands records to a thread through a queue; every
  tracker call (W&B's start, MLflow's HTTP requests) happens on that thread. A tracker that is
  down or slow keeps its records buffered, warns once in the rank log, and is tried again;
  whatever it has not received at the end of the attempt is written to
  ``tracking/unsent.jsonl`` and, since ``metrics.jsonl`` keeps every record and
  ``tracking/state.json`` the last step each tracker received, sent by the next attempt or by
  ``hpctrain sync RUN``.

Nothing here imports wandb or mlflow at module level: they are optional extras
(``hpctrain[wandb]``, ``hpctrain[mlflow]``), imported on the tracker thread.
"""
