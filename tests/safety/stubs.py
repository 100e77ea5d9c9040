"""Slurm's commands and the batch steps' python as small recording scripts, and a driver that runs
many rendered batch scripts under bash with them, noting any that ran a payload.

Only the commands are fake (they record their arguments and environment); bash, the script,
its quoting and its control flow are real. A payload that escaped its quotes would run
``touch CANARY``; the driver checks for the canary after every script.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

SRUN = r"""#!/bin/bash
printf '%s\0' "$@" > "$STUB_LOG.srun"
env -0 > "$STUB_LOG.srun-env"
exit 0
"""

PYTHON = r"""#!/bin/bash
# stands in for `python -m hpctrain.scheduler.slurm.batch_steps CMD ...` on the batch host
printf '%s\0' "$@" >> "$STUB_LOG.py"
case "$3" in
  begin)
    printf '%s' "$4" > "$STUB_LOG.begin-run-dir"
    mkdir -p "$STUB_ATTEMPT_DIR"
    printf 'HPCTRAIN_ATTEMPT=1\nHPCTRAIN_ATTEMPT_DIR=%q\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\nHPCTRAIN_SIGNAL_FLAG=%q\n' \
      "$STUB_ATTEMPT_DIR" "$STUB_ATTEMPT_DIR/flag" ;;
  end) echo HPCTRAIN_REQUEUE=0 ;;
  master-addr) echo 127.0.0.1 ;;
  signal) echo HPCTRAIN_SIGNAL_ACTION=now ;;
esac
exit 0
"""

QUIET = "#!/bin/bash\nexit 0\n"

DRIVER = r"""#!/bin/bash
# driver CANARY BIN CASES...: run each case's script.sh in its folder, one after another
canary=$1; bin=$2; shift 2
for d in "$@"; do
  ( cd "$d" && env -i PATH="$bin:/usr/bin:/bin" HOME="$d" LANG=C SLURM_JOB_ID=4242 \
      SLURM_JOB_NODELIST=n1 SLURM_ARRAY_JOB_ID=4242 SLURM_ARRAY_TASK_ID=1 \
      STUB_LOG="$d/stub" STUB_ATTEMPT_DIR="$d/attempt" \
      timeout 60 bash "$d/script.sh" >"$d/out" 2>&1 </dev/null; echo $? >"$d/rc" )
  if [ -e "$canary" ]; then : >"$d/EXECUTED"; rm -f "$canary"; fi
done
"""


def _write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def install(root: Path) -> tuple[Path, Path]:
    """Stub commands in ``root/bin`` and the batch steps' python at ``root/python``."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    _write_exe(bin_dir / "srun", SRUN)
    for name in ("scontrol", "squeue", "sbatch", "sacct", "module"):
        _write_exe(bin_dir / name, QUIET)
    return bin_dir, _write_exe(root / "python", PYTHON)


def install_python_at(path: str) -> None:
    """The batch steps' stand-in at a path a test case chose (its payload)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_exe(Path(path), PYTHON)


def run_all(root: Path, bin_dir: Path, canary: Path, case_dirs: list[Path],
            workers: int = 2) -> None:
    """Run every case's script; ``workers`` bash drivers share the cases. Each checks the
    canary after each script and marks the case (with two workers, the case running beside
    it at the time may be marked instead: the test fails either way and names both)."""
    driver = _write_exe(root / "driver.sh", DRIVER)
    procs = []
    for w in range(workers):
        mine = [str(d) for d in case_dirs[w::workers]]
        if mine:
            procs.append(subprocess.Popen(["bash", str(driver), str(canary), str(bin_dir),
                                           *mine]))
    for p in procs:
        assert p.wait(timeout=900) == 0


def srun_args(case_dir: Path) -> list[str]:
    raw = (case_dir / "stub.srun").read_bytes()
    return raw.decode("utf-8", "surrogateescape").split("\0")[:-1]


def srun_env(case_dir: Path) -> dict[str, str]:
    raw = (case_dir / "stub.srun-env").read_bytes().decode("utf-8", "surrogateescape")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
