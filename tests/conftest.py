"""Fixtures shared by every test folder: the repo, isolated run folders, the dev Slurm cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The tests' fault injection (hpctrain.fault_injection) works only with this switch; every
# process the tests start inherits it. A variable in a user's shell without it does nothing.
os.environ["HPCTRAIN_TEST_HOOKS"] = "1"


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def runs_root(tmp_path, monkeypatch) -> Path:
    """Run folders of this test only ($HPCTRAIN_RUNS_DIR points here)."""
    root = tmp_path / "runs"
    monkeypatch.setenv("HPCTRAIN_RUNS_DIR", str(root))
    return root


def hpctrain(*args: str, env: dict | None = None, timeout: float = 600,
             check: bool = False) -> subprocess.CompletedProcess:
    """Run the real `hpctrain` console entry point in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"hpctrain {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The dev Slurm cluster started by tools/test (tools/dev_cluster start); fails, never skips,
    when it is not up, so a missing cluster cannot pass silently."""
    conf = os.environ.get("SLURM_CONF")
    assert conf and Path(conf).exists(), (
        "the dev Slurm cluster is not running: run the suite with tools/test, or start it with "
        "tools/dev_cluster start and eval \"$(tools/dev_cluster env)\"")
    assert shutil.which("sinfo"), "Slurm client tools are not installed (tools/dev_cluster start)"
    out = subprocess.run(["sinfo", "-h", "-o", "%D %T"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"sinfo failed: {out.stderr}"
    return conf


def wait_until(predicate, timeout: float = 120, interval: float = 0.5, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` on timeout."""
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def job_gone(job_id: str) -> bool:
    """True once Slurm no longer lists the job as pending or running (batch shell finished)."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True, timeout=30)
    return out.returncode != 0 or not out.stdout.strip()
