"""Where jobs run, split as submitit splits its executors: ``slurm`` (sbatch scripts rendered
from ``sbatch_templates/``, Slurm's commands, the batch steps) and ``local`` (this machine,
submitit's local executor); ``state`` joins both backends' view of a run's jobs."""
