"""A real MLflow tracking server for the tracking tests: ``mlflow server`` on a SQLite store and
a free loopback port, started and killed (SIGKILL, as a crashed server) by the test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hpctrain.identity import free_port


class MlflowServer:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        # outside the kernel's ephemeral range (hpctrain's own rendezvous port choice): a port
        # from bind(0) is one the kernel also gives to outgoing connections, which may take it
        # before the server binds it, or while it is down between a kill and its restart
        self.port = free_port("127.0.0.1")
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> "MlflowServer":
        log = open(self.folder / "server.log", "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
             "--artifacts-destination", str(self.folder / "artifacts")],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.folder, start_new_session=True,
            # no background job workers (MLflow's GenAI jobs): a tracking store is all we need
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                log_text = (self.folder / "server.log").read_text()[-2000:]
                raise RuntimeError(f"mlflow server exited: {log_text}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.kill()
        raise RuntimeError(f"mlflow server did not answer within {timeout:.0f} s")

    def kill(self) -> None:
        """SIGKILL to the server and its workers (its own process group): a crashed server."""
        import signal
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None
