"""A run seen from outside: its state as a person thinks of it, and following it to its end.

Both join the run record (``hpctrain.record``) with the scheduler's live view of the run's
jobs, and neither changes anything: following can stop and start again at any time.

* ``runview`` — :class:`~.runview.RunView`: one run's state, current job, progress and history;
* ``follow`` — progress lines, attempt outcomes and requeues as they happen (``submit --wait``,
  ``logs --follow``, ``Run.wait()``).
"""
