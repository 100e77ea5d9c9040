"""The Slurm backend: the only code that runs Slurm's commands, renders batch scripts and
runs the batch shell's steps."""
