"""The training runtime: what runs inside every rank of a job.

``entry.train_main(run_dir)`` is the callable the submit side launches (one per GPU under
srun; one per process under the local executor); ``python -m hpctrain.runtime RUN_DIR`` runs
the same. Importing this package is cheap: torch and megatron-core are imported only inside
the functions that need them.
"""
