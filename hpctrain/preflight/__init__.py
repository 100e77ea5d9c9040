"""Preflight: find the bad node before it burns the allocation.

Node checks (GPUs, topology, InfiniBand, NCCL environment, storage, software) are pure
``parse_*``/``check_*`` functions over the real output of ``nvidia-smi``, ``ibstat``, sysfs and
``/proc/mounts``, each behind one thin runner in :mod:`.tools`. Collective checks
(:mod:`.collective`) run real ``torch.distributed`` all-reduces across the allocation, locate
slow nodes by re-testing subgroups, and turn a hang into a failure that names the ranks that
did not answer. :mod:`.job` ties both together inside a job; :mod:`.gate` is the training
script's first step. Importing this package imports neither torch nor megatron.
"""
