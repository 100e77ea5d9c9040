"""The run record: everything a run folder holds, and the rules for writing and reading it.

The ranks, the batch shell, the CLI and the Python API all share this package, so it sits at
the bottom of the layers: it imports only ``config``, ``errors``, ``exit_codes`` and ``limits``, never
torch, a scheduler or anything that reports on a run.

* ``folder`` — :class:`~.folder.RunFolder`: the folder's paths, ``run.yaml``, the ledger, the
  events and metrics; finding, listing and creating run folders;
* ``files`` — the file primitives: the folder lock and JSONL records appended whole;
* ``reader`` — the one reader of run-folder files: regular files only, never blocking,
  bounded, records checked against their types; what cannot be read is a ``DamagedFile``;
* ``attempt_records`` — the typed records an attempt leaves (``result.json``, a rank's failure,
  a ledger line), readable from any older version;
* ``attempt_end`` — the end of an attempt: merge what the ranks and the scheduler know, decide,
  append the ledger record;
* ``requeue_policy`` — whether an ended attempt is requeued: a pure function of the ledger;
* ``checkpoint_store`` — the checkpoint folder on disk: complete checkpoints published by a
  marker written last, verified, quarantined, pruned, owned by one run.
"""
