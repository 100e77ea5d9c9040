"""The local backend: a job's ranks on this machine through submitit's local executor."""
