"""Day-to-day operations on run folders: list, inspect, cancel, requeue, resume, report
(submitting is ``hpctrain.submission``'s, following a run ``hpctrain.view``'s).

Everything here reads the run folder (run.yaml, ledger, events, metrics, checkpoints) and asks
the scheduler through ``hpctrain.scheduler`` only; nothing imports torch, and matplotlib is
imported by the report alone, when a report is drawn.
"""
