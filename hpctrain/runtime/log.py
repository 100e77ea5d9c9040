"""The ``hpctrain`` logger inside a rank, and where a rank's output goes.

Every rank writes its own log (under Slurm srun sends each task's output to
``logs/attempt-N/rank-R.log``; under the local executor ``HPCTRAIN_LOG_TO_FILE=1`` makes the
rank redirect its own stdout/stderr file descriptors there, so even C++ and NCCL/gloo
messages land in it). Rank 0 also prints the progress lines. Lines carry the rank and time.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

logger = logging.getLogger("hpctrain")


def redirect_output(path: Path) -> None:
    """Point this process's fds 1 and 2 at ``path`` (appending; a regular file only, through
    the run folder's door: a FIFO or a link there is an error naming it, not a hang)."""
    from ..record.files import open_for_append
    fd = open_for_append(Path(path))
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def setup(rank: int) -> logging.Logger:
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank}: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    quiet_dependencies()
    return logger


def quiet_dependencies() -> None:
    """megatron-core warns about every missing optional CUDA kernel at import; on the CPU
    rehearsal those warnings are expected noise that hides the real log."""
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|TE) .*not installed.*")
    warnings.filterwarnings("ignore", message=".*Falling back to.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS.*")
    warnings.filterwarnings("ignore", message=".*is not a leaf Tensor.*")
    warnings.filterwarnings("ignore", message=".*cuda_graph_scope.*")
    for name in ("megatron", "megatron.core"):
        logging.getLogger(name).setLevel(logging.WARNING)
