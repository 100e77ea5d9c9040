"""Start the ranks of a run on this machine without a scheduler, one process each.

For tools that time the runtime, preflight on a profile without a scheduler, and tests. Every
process gets torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, a free
``MASTER_PORT`` on 127.0.0.1) as srun would give Slurm's, and loses any other launcher's
(:mod:`hpctrain.identity`, rule 4). Several "nodes" on one host are ``nodes`` blocks of
``ranks_per_node`` ranks, each block named through the test variable
``HPCTRAIN_TEST_NODE_NAME``. Like ``srun --kill-on-bad-exit``, the first rank that fails takes
the others down. The ``local`` profile's real path is submitit's local executor (``hpctrain
submit``).

The ranks run in sessions of their own (a signal meant for one rank's group reaches only it),
so a Ctrl-C at the terminal does not reach them: they die with the process that started them
instead (``die_with_parent``), or a tool stopped on a GPU machine would leave its ranks
holding the GPU.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ... import exit_codes
from ...identity import OTHER_LAUNCHERS_VARIABLES, free_port
from ...record.files import open_for_append


@dataclass
class LocalRanks:
    procs: list[subprocess.Popen] = field(default_factory=list)

    def wait(self, timeout: float = 3600) -> list[int]:
        """Every rank's exit code. The first rank that fails (an exit code outside
        ``exit_codes.NOT_A_CRASH``) ends the others; ranks running past ``timeout`` are killed."""
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in self.procs]
            if all(c is not None for c in codes):
                return codes
            failed = any(c is not None and c not in exit_codes.NOT_A_CRASH for c in codes)
            if failed or time.monotonic() > deadline:
                if failed:
                    time.sleep(0.5)
                self.stop()
                return [p.wait() for p in self.procs]
            time.sleep(0.05)

    def done(self) -> bool:
        """Rank 0 has exited."""
        return bool(self.procs) and self.procs[0].poll() is not None

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()


PR_SET_PDEATHSIG = 1       # prctl(2): the signal this process gets when its parent dies


def _kill_me_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def die_with_parent():
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGKILL when its parent dies
    (Linux). None off the main thread: the kernel sends the signal when the *thread* that
    started the child ends, which for a helper thread may be long before its process does."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return _kill_me_with_parent


def start_ranks(argv: list[str], log_dir: str | os.PathLike, *, nodes: int = 1,
                ranks_per_node: int = 1, env: dict | None = None,
                node_names: list[str] | None = None) -> LocalRanks:
    """``nodes × ranks_per_node`` processes of ``argv``, rank R logging to ``log_dir/rank-R.log``.
    With more than one node, block i is named ``node_names[i]`` (default ``n1``, ``n2``, ...)."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    world = nodes * ranks_per_node
    port = free_port("127.0.0.1")
    extra = {k: str(v) for k, v in (env or {}).items()}
    names = node_names or ([f"n{i + 1}" for i in range(nodes)] if nodes > 1 else None)
    ranks = LocalRanks()
    for rank in range(world):
        e = {**os.environ, "OMP_NUM_THREADS": "1", **extra,
             "RANK": str(rank), "LOCAL_RANK": str(rank % ranks_per_node),
             "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(ranks_per_node),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        for k in OTHER_LAUNCHERS_VARIABLES:
            e.pop(k, None)
        if names:
            e["HPCTRAIN_TEST_NODE_NAME"] = names[rank // ranks_per_node]
        with os.fdopen(open_for_append(Path(log_dir) / f"rank-{rank}.log", truncate=True),
                       "wb") as log:
            ranks.procs.append(subprocess.Popen(argv, env=e, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True,
                                                preexec_fn=die_with_parent()))
    return ranks


def start_training(run_dir: str | os.PathLike, nprocs: int, *, env: dict | None = None,
                   argv: list[str] | None = None, log_dir: str | os.PathLike | None = None
                   ) -> LocalRanks:
    """``python -m hpctrain.runtime RUN_DIR`` (or ``argv``) on ``nprocs`` ranks, logs in
    ``RUN_DIR/local-launch`` unless ``log_dir`` says otherwise."""
    argv = argv or [sys.executable, "-m", "hpctrain.runtime", str(run_dir)]
    return start_ranks(argv, log_dir or Path(run_dir) / "local-launch", ranks_per_node=nprocs,
                       env=env)


def start_preflight(run_dir: str | os.PathLike, nodes: int, ranks_per_node: int, *,
                    env: dict | None = None, node_names: list[str] | None = None,
                    attempt: int | None = None) -> LocalRanks:
    """The preflight job's ranks (``python -m hpctrain.preflight.gate RUN_DIR``), logs in
    ``RUN_DIR/preflight/logs``."""
    argv = [sys.executable, "-m", "hpctrain.preflight.gate", str(run_dir)]
    if attempt is not None:
        argv += ["--attempt", str(attempt)]
    return start_ranks(argv, Path(run_dir) / "preflight" / "logs", nodes=nodes,
                       ranks_per_node=ranks_per_node, env=env, node_names=node_names)


def create_run_folder(path: Path, job: dict, profile: dict):
    """A run folder with the job and profile resolved, as ``hpctrain submit`` leaves it (for
    tools that start the ranks themselves)."""
    from ...config import job_from_mapping, profile_from_mapping, yamlio
    from ...config.schema import to_dict
    from ...record.folder import PRIVATE_MODE, RunFolder
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(PRIVATE_MODE)
    os.chmod(path, PRIVATE_MODE)  # private, as every run folder (mkdir's mode is masked)
    run = RunFolder(path)
    yamlio.write_atomic(run.job_file, yamlio.dump(to_dict(job_from_mapping(job, str(path)))))
    yamlio.write_atomic(run.profile_file, yamlio.dump(to_dict(
        profile_from_mapping(profile, str(path), "local"))))
    run.update_meta(name=path.name, profile=profile.get("name", "local"))
    return run
