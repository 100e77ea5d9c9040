"""Start the ranks of a preflight job on this machine, one process each.

For profiles without a scheduler and for tests: every process gets RANK/WORLD_SIZE/LOCAL_RANK
and MASTER_ADDR/MASTER_PORT like srun would give, and (to rehearse several nodes on one host)
a fake node name through ``HPCTRAIN_TEST_NODE_NAME``. Each rank logs to
``RUN/preflight/logs/rank-R.log``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalLaunch:
    run_dir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def wait(self, timeout: float, grace: float = 10.0) -> int | None:
        """Rank 0's exit code (None if it ran past ``timeout``); stragglers are ended after it."""
        try:
            code = self.procs[0].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        deadline = time.monotonic() + (grace if code is not None else 0)
        for p in self.procs[1:]:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        self.stop()
        return code

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def launch_local(run_dir: str | os.PathLike, nodes: int, ranks_per_node: int, *,
                 env: dict | None = None, node_names: list[str] | None = None,
                 attempt: int | None = None) -> LocalLaunch:
    run_dir = Path(run_dir)
    logs = run_dir / "preflight" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    world = nodes * ranks_per_node
    port = free_port()
    names = node_names or ([f"n{i + 1}" for i in range(nodes)] if nodes > 1 else None)
    launch = LocalLaunch(run_dir)
    cmd = [sys.executable, "-m", "hpctrain.preflight.gate", str(run_dir)]
    if attempt is not None:
        cmd += ["--attempt", str(attempt)]
    for rank in range(world):
        e = {**os.environ, **(env or {}), "RANK": str(rank), "WORLD_SIZE": str(world),
             "LOCAL_RANK": str(rank % ranks_per_node), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "OMP_NUM_THREADS": (env or {}).get("OMP_NUM_THREADS", "1")}
        for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SUBMITIT_EXECUTOR"):
            e.pop(k, None)
        if names:
            e["HPCTRAIN_TEST_NODE_NAME"] = names[rank // ranks_per_node]
        log = open(logs / f"rank-{rank}.log", "wb")
        launch.procs.append(subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()
    return launch
