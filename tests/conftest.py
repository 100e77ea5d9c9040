"""Fixtures shared by every test folder: the repo, isolated run folders, the dev Slurm cluster."""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The tests' fault injection (hpctrain.fault_injection) works only with this switch; every
# process the tests start inherits it. A variable in a user's shell without it does nothing.
os.environ["HPCTRAIN_TEST_HOOKS"] = "1"


# The extra dev clusters tools/test starts when the suite runs on workers (cluster 1 is the one
# SLURM_CONF names), and the Slurm test files that run on each. Each cluster's files form one
# serial group, the longest chains of the suite: the files are spread so the chains take about
# the same time (from a whole run's --durations). A file not listed runs on cluster 1.
def _extra_clusters() -> dict[int, tuple[str, str]]:
    found = {}
    for n in (2, 3, 4, 5):
        conf = os.environ.get(f"HPCTRAIN_TEST_SLURM_CONF_{n}")
        if conf:
            found[n] = (conf, os.environ.get(f"HPCTRAIN_TEST_DEV_CLUSTER_DIR_{n}", ""))
    return found


EXTRA_CLUSTERS = _extra_clusters()
CLUSTER_OF_FILE = {
    "tests/resilience/test_health_drills.py": 2,
    "tests/integration/test_training_jobs.py": 2,
    "tests/safety/test_script_injection.py": 3,
    "tests/ops/test_sweep_array.py": 3,
    "tests/ops/test_cancel_resume.py": 3,
    "tests/ops/test_real_training.py": 3,
    "tests/resilience/test_requeue_limits.py": 4,
    "tests/ops/test_requeue_and_follow.py": 4,
    "tests/ops/test_gpu_hours.py": 4,
    "tests/api/test_python_api.py": 4,
    "tests/bench/test_bench_scaling.py": 4,
    # the drills that wait for Slurm's own timeouts (KillWait, SlurmdTimeout): tools/test starts
    # this cluster with a shorter SlurmdTimeout
    "tests/resilience/test_spare_drills.py": 5,
}


def cluster_of(path: str) -> int:
    """The dev cluster a Slurm test file runs on: its listed one where tools/test started it
    (with fewer clusters, a file goes to the highest one started below its own), else 1."""
    wanted = CLUSTER_OF_FILE.get(path, 1)
    while wanted > 1 and wanted not in EXTRA_CLUSTERS:
        wanted -= 1
    return wanted


@functools.lru_cache(maxsize=None)
def worker_group(path: str) -> str:
    """Which tests may not run beside each other (``tools/test`` runs pytest-xdist workers with
    ``--dist loadscope``; the tests of one group run on one worker, one after another), from
    the test file (``tests/...py``, relative to the repository):

    * ``slurm``, ``slurm-2``, ... : every file with a test that uses a dev Slurm cluster,
      one group per cluster (:func:`cluster_of`). A cluster is one shared resource (three
      nodes; a preemption drill takes every node of a partition), so its tests never run beside
      each other, whatever their folder; the clusters run side by side
      (:func:`_the_file_s_cluster`);
    * ``megatron-workspace``: the runtime tests that share the session workspace (the prepared
      corpus, the exported initial weights and the reference runs trained once), made once;
    * otherwise the file itself, so a module-scoped fixture is made once."""
    text = (REPO / path).read_text()
    if "slurm_cluster" in text or "mark.slurm" in text:
        n = cluster_of(path)
        return "slurm" if n == 1 else f"slurm-{n}"
    if re.search(r"def test_\w+\([^)]*\bws\b", text):
        return "megatron-workspace"
    return path


# The groups that take longest (from --durations of whole runs on a 2-core machine: each Slurm
# group 300-650 s, the runtime workspace about 600 s, then single files of 150-280 s), in the
# order the workers take them. The first worker whose group ends early (a cluster with few
# tests) takes the next one, so none of them waits behind another.
LONGEST_FIRST = ("slurm", "slurm-2", "slurm-3", "slurm-4", "slurm-5", "megatron-workspace",
                 "tests/runtime/test_gpu_check.py", "tests/safety/test_bad_files.py",
                 "tests/safety/test_fuzz.py", "tests/runs/test_hostile_records.py")


@pytest.hookimpl(optionalhook=True)   # a hook of pytest-xdist: the suite runs without it too
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with ``worker_group``'s groups as the scopes (pytest-xdist's own
    ``xdist_group`` marks do not reach its scheduler under pytest 9's node ids)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid.split("::", 1)[0])

        def _assign_work_unit(self, node) -> None:
            # the longest chains start first, each on a worker of its own: a long one taken
            # last would run alone at the end, on one of the machine's cores
            for scope in reversed(LONGEST_FIRST):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


@pytest.fixture(scope="module", autouse=True)
def _the_file_s_cluster(request):
    """The dev cluster of this test file's group: ``SLURM_CONF`` (which every Slurm command and
    every process a test starts reads) and ``HPCTRAIN_DEV_CLUSTER_DIR`` point to the file's
    extra cluster (:func:`cluster_of`), for as long as the file's tests and fixtures run."""
    path = Path(str(request.fspath)).resolve()
    try:
        rel = str(path.relative_to(REPO))
    except ValueError:
        rel = ""
    n = cluster_of(rel) if rel and worker_group(rel).startswith("slurm") else 1
    if n == 1:
        yield
        return
    conf, folder = EXTRA_CLUSTERS[n]
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "HPCTRAIN_DEV_CLUSTER_DIR")}
    os.environ["SLURM_CONF"] = conf
    os.environ["HPCTRAIN_DEV_CLUSTER_DIR"] = folder
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# Signals a test may change the handling of in this process: the runtime's preemption flag
# (installed, or set to be ignored once a rank stands down), the batch steps' shield against
# the SIGTERM of their own requeue, a test's alarm. Each is put back after every test as the
# test found it: a handler left behind answers for the next test on the worker, and an
# ignored signal is inherited by every process a later test starts (a SIGTERM ignored there
# made a tokenizer pool's terminate wait its 30 s for workers that would not end).
_GUARDED_SIGNALS = tuple(getattr(signal, name) for name in (
    "SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGXFSZ", "SIGPIPE")
    if hasattr(signal, name))


@pytest.fixture(autouse=True)
def _signals_as_found():
    before = {sig: signal.getsignal(sig) for sig in _GUARDED_SIGNALS}
    yield
    for sig, handler in before.items():
        if handler is not None and signal.getsignal(sig) != handler:
            signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def _environment_as_found():
    """The environment, put back after every test as the test found it. Commands run here
    in-process set variables for the rest of their own process (sync sets
    MLFLOW_LOGGING_LEVEL, a tracker MLflow's HTTP retries and timeout): in this process they
    stayed for every later test on the worker, and every process it starts inherited them.
    (A test's own changes go through monkeypatch.)"""
    env = dict(os.environ)
    yield
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


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


def one_error_line(proc, *needles: str, code: int = 2) -> None:
    """A CLI process refused its input as hpctrain must: exit ``code`` (2, a usage error) and
    exactly one printable ``Error:`` line on stderr, holding each of ``needles``."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and lines[0].isprintable(), proc.stderr
    for needle in needles:
        assert needle in lines[0], proc.stderr


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


def unix_socket_at(path: Path) -> None:
    """A UNIX socket file at ``path``, however long the path (``bind`` takes at most 107 bytes:
    bound by its name from inside its folder)."""
    import socket
    here = os.getcwd()
    s = socket.socket(socket.AF_UNIX)
    try:
        os.chdir(path.parent)
        s.bind(path.name)
    finally:
        os.chdir(here)
        s.close()


def tool_module(name: str):
    """A script of ``tools/`` (no ``.py``, so not importable by name) loaded as a module."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader(name, str(REPO / "tools" / name))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def token_corpus(path, docs: int, doc_len: int, *, stride: int = 1, doc_shift: int = 1,
                 base: int = 0, vocab: int = 200) -> str:
    """An indexed corpus at ``path`` (its prefix, returned): ``docs`` documents of ``doc_len``
    tokens, token ``i`` of document ``d`` being ``(i * stride + base + d * doc_shift) % vocab``
    (every sample can be told from its neighbours)."""
    import numpy as np

    from hpctrain.data import indexed
    with indexed.IndexedDatasetWriter(path, np.uint16) as w:
        for d in range(docs):
            w.add_document((np.arange(doc_len) * stride + base + d * doc_shift) % vocab)
    return str(path)


def flip_byte(path, at: int | None = None) -> None:
    """Invert one byte of the file at ``path`` (``at``, else the middle one): damage that keeps
    the file's size, so only a checksum can find it."""
    from pathlib import Path
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0xFF
    Path(path).write_bytes(bytes(data))


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


# Property-based tests (Hypothesis): a fixed, small budget and derandomized generation in the
# suite, so a run takes seconds and gives the same verdict on every machine. Developers raise
# the budget with HPCTRAIN_HYPOTHESIS_EXAMPLES=2000 (docs/contributing.md).
try:
    from hypothesis import HealthCheck, settings as _hypothesis_settings
except ImportError:   # the test extra installs it; only a bare checkout lacks it
    pass
else:
    _hypothesis_settings.register_profile(
        "hpctrain", derandomize=True, database=None, deadline=None, print_blob=True,
        max_examples=int(os.environ.get("HPCTRAIN_HYPOTHESIS_EXAMPLES", "60")),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    _hypothesis_settings.load_profile("hpctrain")


def dry_run_folders(root: Path, n: int = 2) -> list[Path]:
    """``n`` real run folders under ``root`` (``hpctrain submit --dry-run`` of the tiny job on
    the local profile, through the CLI), oldest first."""
    from click.testing import CliRunner

    from hpctrain.cli import cli
    for _ in range(n):
        result = CliRunner().invoke(cli, ["submit", str(REPO / "examples" / "tiny.yaml"),
                                          "--dry-run"], env={"HPCTRAIN_RUNS_DIR": str(root)})
        assert result.exit_code == 0, result.output
    runs = sorted(p for p in root.iterdir() if (p / "run.yaml").is_file())
    assert len(runs) == n
    return runs
