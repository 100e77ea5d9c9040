"""Start the ranks of a run on this machine without a scheduler (benchmarks, rehearsals).

Each rank is ``python -m hpctrain.runtime RUN_DIR`` with torchrun's variables (RANK,
WORLD_SIZE, a free MASTER_PORT on 127.0.0.1). Like ``srun --kill-on-bad-exit``, the first
rank that fails takes the others down. The ``local`` profile's real path is submitit's local
executor (``hpctrain submit``); this is the bare minimum for tools that time the runtime.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CLEAN_EXITS = (0, 3, 75, 144)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_run_folder(path: Path, job: dict, profile: dict):
    """A run folder with the job and profile resolved, as ``hpctrain submit`` leaves it."""
    from ..config import job_from_mapping, profile_from_mapping, yamlio
    from ..config.schema import to_dict
    from ..runs import PRIVATE_MODE, Run
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(PRIVATE_MODE)
    os.chmod(path, PRIVATE_MODE)  # private, as every run folder (mkdir's mode is masked)
    run = Run(path)
    yamlio.write_atomic(run.job_file, yamlio.dump(to_dict(job_from_mapping(job, str(path)))))
    yamlio.write_atomic(run.profile_file, yamlio.dump(to_dict(
        profile_from_mapping(profile, str(path), "local"))))
    run.update_meta(name=path.name, profile=profile.get("name", "local"))
    return run


def start_ranks(run_dir: Path, nprocs: int, env: dict | None = None, argv: list[str] | None = None,
                log_dir: Path | None = None) -> list[subprocess.Popen]:
    port = free_port()
    log_dir = Path(log_dir or Path(run_dir) / "local-launch")
    log_dir.mkdir(parents=True, exist_ok=True)
    argv = argv or [sys.executable, "-m", "hpctrain.runtime", str(run_dir)]
    procs = []
    for rank in range(nprocs):
        rank_env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    **{k: str(v) for k, v in (env or {}).items()}}
        with open(log_dir / f"rank-{rank}.out", "w") as out:
            procs.append(subprocess.Popen(argv, env=rank_env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    return procs


def wait_ranks(procs: list[subprocess.Popen], timeout: float = 3600) -> list[int]:
    """Exit codes of every rank; the first abnormal exit kills the rest."""
    deadline = time.time() + timeout
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        failed = any(c is not None and c not in CLEAN_EXITS for c in codes)
        if failed or time.time() > deadline:
            if failed:
                time.sleep(0.5)
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            return [p.wait() for p in procs]
        time.sleep(0.05)
