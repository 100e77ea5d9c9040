"""Where jobs run: one backend interface (``backend``: submit, the state of a run's jobs,
cancel, requeue, a job's node list), chosen once from the profile (``choose``), with two
implementations split as submitit splits its executors: ``slurm`` (sbatch scripts rendered from
``sbatch_templates/``, Slurm's commands, the batch steps) and ``local`` (this machine,
submitit's local executor). ``state`` asks each run's backend for its jobs."""
