"""hpctrain: from a YAML description to a healthy, self-healing Slurm training job.

Importing the package is cheap on purpose (no torch, no megatron): the CLI imports the heavy
runtime only on the paths that train.
"""

__version__ = "0.1.0"
