"""Start N training ranks on this machine, the way srun or torchrun would, for tests.

Each rank gets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (a free
port) and runs ``hpctrain.runtime`` on a run folder. Two ways to start them:

* ``mode="exec"``: one ``python -m hpctrain.runtime RUN_DIR`` process per rank (the real
  command line);
* ``mode="fork"`` (default): a fork server, started once per test session, imports torch and
  megatron-core, then forks a supervisor per launch, which forks the ranks. Same code, same
  separate processes and gloo groups, but the ~10 s of imports per rank is paid once per
  session — on a 2-core machine that is the difference between a test suite of minutes and
  one of a quarter hour.

Like ``srun --kill-on-bad-exit``, the first rank that dies abnormally (an exit code outside
``exit_codes.NOT_A_CRASH``) takes the others down, unless ``kill_on_failure=False`` (a test that
checks the runtime brings itself down). Each rank's stdout/stderr goes to ``OUT_DIR/rank-R.out``.
Other launchers' variables are cleared and the tests' fault injection is switched on
(``HPCTRAIN_TEST_HOOKS=1``).

Ranks never outlive the process that launched them. A test killed by its timeout (the mutation
tool's, or a person's Ctrl-C) would otherwise leave ranks that never finish spinning for hours
and slowing every later test: a forked launch's supervisor kills its ranks once the launching
process is gone, and an exec'd rank is killed by the kernel when its parent dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpctrain.exit_codes import NOT_A_CRASH
from hpctrain.identity import OTHER_LAUNCHERS_VARIABLES, free_port
from hpctrain.scheduler.local.launch import die_with_parent

REPO = Path(__file__).resolve().parent.parent


def rank_env(rank: int, world: int, port: int, extra: dict | None = None) -> dict:
    """Torchrun's variables for ``rank`` (the tests' fault injection switched on)."""
    env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "HPCTRAIN_TEST_HOOKS": "1"}
    env.update(extra or {})
    return env


@dataclass
class Result:
    codes: list[int]
    seconds: float
    out_dir: Path

    def output(self, rank: int) -> str:
        p = self.out_dir / f"rank-{rank}.out"
        return p.read_text(errors="replace") if p.exists() else ""

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.codes)

    def tail(self, rank: int = 0, lines: int = 40) -> str:
        return "\n".join(self.output(rank).splitlines()[-lines:])


class Launch:
    def __init__(self, run_dir, nprocs: int, env: dict | None = None, mode: str = "fork",
                 kill_on_failure: bool = True, out_dir=None, module: str = "hpctrain.runtime",
                 args: list[str] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.nprocs = nprocs
        self.mode = mode
        self.kill_on_failure = kill_on_failure
        self.out_dir = Path(out_dir or self.run_dir / "launch")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for f in self.out_dir.glob("*"):
            f.unlink()
        self.port = free_port()
        self.extra = {k: str(v) for k, v in (env or {}).items()}
        self.started = time.time()
        base = {k: v for k, v in os.environ.items() if k not in OTHER_LAUNCHERS_VARIABLES}
        base["PYTHONPATH"] = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.procs: list[subprocess.Popen] = []
        argv = [module, *(args if args is not None else [str(self.run_dir)])]
        if mode == "exec":
            for r in range(nprocs):
                out = open(self.out_dir / f"rank-{r}.out", "w")
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", *argv],
                    env={**base, **rank_env(r, nprocs, self.port, self.extra)},
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=die_with_parent()))
                out.close()
        else:
            _server().submit({"run_dir": str(self.run_dir), "n": nprocs, "port": self.port,
                              "env": self.extra, "out": str(self.out_dir), "argv": argv,
                              "kill_on_failure": kill_on_failure, "owner": os.getpid()})

    def pids(self, timeout: float = 60) -> list[int]:
        """The ranks' process ids (rank order)."""
        if self.mode == "exec":
            return [p.pid for p in self.procs]
        path = self.out_dir / "pids.json"
        end = time.time() + timeout
        while time.time() < end:
            if path.exists():
                try:
                    return json.loads(path.read_text())
                except json.JSONDecodeError:
                    pass
            time.sleep(0.05)
        raise TimeoutError("the launcher did not report the ranks' pids")

    def signal_rank(self, rank: int, sig=signal.SIGUSR1) -> None:
        os.kill(self.pids()[rank], sig)

    def wait(self, timeout: float = 300) -> Result:
        end = self.started + timeout
        if self.mode == "exec":
            codes = _monitor(self.procs, self.kill_on_failure, end)
        else:
            codes_file = self.out_dir / "codes.json"
            while not codes_file.exists():
                if time.time() > end:
                    self.kill()
                    raise TimeoutError(f"launch did not finish in {timeout}s; see {self.out_dir}")
                if not _server().alive():
                    raise RuntimeError(f"the fork server died; see {_server().log}")
                time.sleep(0.05)
            codes = json.loads(codes_file.read_text())
        return Result(codes=codes, seconds=time.time() - self.started, out_dir=self.out_dir)

    def kill(self) -> None:
        if self.mode == "exec":
            for p in self.procs:
                _killpg(p.pid)
            return
        supervisor = self.out_dir / "supervisor.pid"
        if supervisor.exists():
            _kill(int(supervisor.read_text()))
        try:
            for pid in self.pids(timeout=0.1):
                _kill(pid)
        except TimeoutError:
            pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        _kill(pid)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _monitor(procs, kill_on_failure: bool, deadline: float, owner: int | None = None) -> list[int]:
    """Wait for every process; on the first abnormal exit kill the rest, and kill them all
    once ``owner`` (the process that launched them) is gone."""
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        if owner is not None and not _alive(owner):
            for p in procs:
                if p.poll() is None:
                    _killpg(p.pid)
            return [p.wait() for p in procs]
        if kill_on_failure and any(c is not None and c not in NOT_A_CRASH for c in codes):
            time.sleep(0.5)  # let the failing rank's peers write their own last words
            for p in procs:
                if p.poll() is None:
                    _killpg(p.pid)
            return [p.wait() for p in procs]
        if time.time() > deadline:
            for p in procs:
                _killpg(p.pid)
            raise TimeoutError("ranks did not finish in time")
        time.sleep(0.05)


def launch(run_dir, nprocs: int, env: dict | None = None, timeout: float = 300, **kw) -> Result:
    """Start ``nprocs`` ranks on ``run_dir`` and wait for them."""
    return Launch(run_dir, nprocs, env=env, **kw).wait(timeout)


# ----------------------------------------------------------------------------- fork server
class _ForkServer:
    """A process that imported the heavy modules once and forks a supervisor per launch."""

    def __init__(self) -> None:
        import tempfile
        self.log = Path(tempfile.mkstemp(prefix="hpctrain-fork-server-", suffix=".log")[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, "--server"], env=env,
                                         stdin=subprocess.PIPE, stdout=log,
                                         stderr=subprocess.STDOUT, text=True,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def submit(self, spec: dict) -> None:
        self.proc.stdin.write(json.dumps(spec) + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                _killpg(self.proc.pid)
        if self.proc.returncode == 0:
            self.log.unlink(missing_ok=True)


_SERVER: _ForkServer | None = None


def _server() -> _ForkServer:
    global _SERVER
    if _SERVER is None or not _SERVER.alive():
        import atexit
        _SERVER = _ForkServer()
        atexit.register(_SERVER.stop)
    return _SERVER


class _Forked:
    """A forked rank, with the small part of Popen's interface _monitor uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.code: int | None = None

    def poll(self):
        if self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self):
        if self.code is None:
            _, status = os.waitpid(self.pid, 0)
            self.code = os.waitstatus_to_exitcode(status)
        return self.code


def _run_rank(spec: dict, rank: int) -> None:
    """In a forked rank: become rank ``rank`` and run the module's ``main``."""
    import importlib
    code = 1
    try:
        fd = os.open(Path(spec["out"]) / f"rank-{rank}.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        for k in OTHER_LAUNCHERS_VARIABLES:
            os.environ.pop(k, None)
        os.environ.update(rank_env(rank, spec["n"], spec["port"], spec["env"]))
        module, *args = spec["argv"]
        target = importlib.import_module(module)
        if not hasattr(target, "main"):  # a package run with -m: its __main__ module
            target = importlib.import_module(f"{module}.__main__")
        code = target.main(args)
    except SystemExit as e:
        code = int(e.code or 0)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def _supervise(spec: dict) -> None:
    """In a forked supervisor: fork the ranks, report their pids and exit codes."""
    out = Path(spec["out"])
    (out / "supervisor.pid").write_text(str(os.getpid()))
    children = []
    for r in range(spec["n"]):
        pid = os.fork()
        if pid == 0:
            _run_rank(spec, r)
        children.append(_Forked(pid))
    (out / "pids.json").write_text(json.dumps([c.pid for c in children]))
    codes = _monitor(children, spec["kill_on_failure"], time.time() + 24 * 3600,
                     owner=spec.get("owner"))
    tmp = out / "codes.json.tmp"
    tmp.write_text(json.dumps(codes))
    os.replace(tmp, out / "codes.json")


def _serve() -> None:
    sys.path.insert(0, str(REPO))
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()  # the tests rehearse on CPU; prepare_device would install it anyway
    from hpctrain.runtime.versions import import_megatron_core
    import_megatron_core()                     # as a rank does
    import megatron.core.dist_checkpointing  # noqa: F401  - the slow imports, paid once
    import megatron.core.models.gpt.gpt_model  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel.schedules  # noqa: F401
    import hpctrain.runtime.__main__  # noqa: F401
    import hpctrain.runtime.entry  # noqa: F401
    import hpctrain.runtime.init_weights  # noqa: F401
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped automatically
    print("fork server ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(line)
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the supervisor waits for its ranks
            code = 0
            try:
                os.setsid()
                _supervise(spec)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--server"]:
        _serve()
