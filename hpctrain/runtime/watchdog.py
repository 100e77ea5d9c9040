"""The hang watchdog in every rank: a side thread that beats, and dumps and exits on a hang.

The training thread only sets a few attributes when it makes progress (a step finished, a
save or load phase began: :meth:`Watchdog.progress`); no I/O, no lock, nothing in the step.
A daemon thread, independent of the training thread, rewrites this rank's heartbeat file
(``hpctrain.health.heartbeat``) every ``BEAT_S`` seconds with the step, the phase, the last
progress, the collectives issued per process group and where the main thread is, and looks
for the attempt's verdict (``hang.json``).

On a verdict every live rank writes its Python stacks (all threads) to
``logs/attempt-N/stacks-rank-R.txt`` — ``faulthandler`` needs no cooperation from the stuck
thread — and native frames too when ``py-spy`` is installed, then exits with
``exit_codes.HUNG``: the others are stuck in a collective and would never return. A rank
stopped with SIGSTOP cannot do any of this: the batch shell's watcher sends SIGQUIT, which
``faulthandler`` handles in C (it dumps the stacks as the process resumes), then SIGCONT, as
nvidia-resiliency-ext's rank monitor wakes a stopped rank before terminating it.

Who decides: the batch shell's watcher (``hpctrain.scheduler.slurm.hang_watch``) on Slurm.
Where none runs (the local executor, another launcher) a rank's own thread decides, once this
rank itself has made no progress for the limit (a hung job stops every rank): it reads every
heartbeat, blames the rank that stopped first and claims the verdict; it also wakes and
signals the silent ranks on its own node. With a watcher it still decides after twice the
limit and a minute more, in case the watcher is gone.

How long a rank has been idle is measured on the monotonic clock. The wall clock can be
stepped (an NTP correction, a VM resumed): measured on it, a step forward by more than the
limit would make a healthy job look hung and requeue it, and a step back would hide a real
hang for as long as the step. Each beat writes the last progress on the wall clock of the
moment (``beat_at`` minus the monotonic idle time), so ``beat_at - progress_at`` is the idle
time whatever the wall clock did.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .. import exit_codes, limits
from ..health import hang as hangs
from ..health.heartbeat import EXITING, Beat, write_beat
from ..record import reader

BEAT_S = 5.0
DUMP_SIGNAL = signal.SIGQUIT        # the JVM's "kill -3": dump the stacks, keep running
GPU_FLOOR_S = 300.0                 # derived limits: never below 5 minutes on GPUs,
CPU_FLOOR_S = 60.0                  # a minute on the CPU rehearsal
STEPS_OF_SLACK = 20                 # derived limit: 20 × the slowest step so far
WATCHER_GRACE_S = 60.0
PY_SPY_TRIES = 3                    # native unwinding fails now and then; the next try works
PY_SPY_TIMEOUT_S = 120.0            # all tries of one dump together
PEERS_WAIT_S = 20.0                 # on a hang: wait this long at most for the others' stacks
END_OF_STACKS = "-- end of the stacks of rank"
WATCHER_ENV = "HPCTRAIN_HEALTH_WATCHER"   # "batch": the batch shell watches, excludes nodes


def hang_limit(configured: float | None, device: str, slowest_step_s: float | None,
               first_step_done: bool, init_timeout_s: float) -> float:
    """``health.hang_timeout_s`` when set, else 20 × the slowest step seen (at least 5 minutes
    on GPUs, 1 on the CPU rehearsal); until the first step is done at least
    ``train.init_timeout_s`` (the first step creates the communicators, which takes minutes on
    thousands of GPUs)."""
    if configured:
        limit = float(configured)
    else:
        floor = GPU_FLOOR_S if device == "cuda" else CPU_FLOOR_S
        limit = max(floor, STEPS_OF_SLACK * (slowest_step_s or 0.0))
    return limit if first_step_done else max(limit, float(init_timeout_s))


def main_thread_where(depth: int = 2) -> str | None:
    """The main thread's innermost frames, e.g. ``all_reduce (distributed_c10d.py:2950) <-
    start_grad_sync (param_and_grad_buffer.py:412)``."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    parts = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})")
        frame = frame.f_back
    return " <- ".join(parts) or None


def collective_counts(cache: dict) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Collectives issued so far on each process group this rank belongs to (torch's per-group
    sequence numbers, counted when a collective is issued), and each group's ranks. Empty
    before the process group exists, or where torch does not keep the numbers."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {}, {}
    counts, members = {}, {}
    try:
        groups = list(dist.distributed_c10d._world.pg_names.items())
    except Exception:  # noqa: BLE001 - torch's internals moved: no counts, the rest still works
        return {}, {}
    for pg, name in groups:
        try:
            counts[name] = int(pg._get_sequence_number_for_group())
            if name not in cache:
                cache[name] = list(dist.get_process_group_ranks(pg))
            members[name] = cache[name]
        except Exception:  # noqa: BLE001 - a backend without sequence numbers
            continue
    return counts, members


class Watchdog:
    def __init__(self, attempt_dir: Path, rank: int, node: str, *, hang_timeout_s: float | None,
                 dump_stacks: bool, device: str, init_timeout_s: float,
                 watcher: bool | None = None, beat_s: float = BEAT_S, on_verdict=None,
                 log=print) -> None:
        self.dir = Path(attempt_dir)
        self.rank, self.node = rank, node
        self.configured, self.dump_stacks = hang_timeout_s, dump_stacks
        self.device, self.init_timeout_s = device, init_timeout_s
        self.watcher = (os.environ.get(WATCHER_ENV) == "batch") if watcher is None else watcher
        self.beat_s = beat_s
        self.on_verdict = on_verdict      # rank 0 under the local executor records the attempt
        self.log = log
        self.step: int | None = None
        self.start_step: int | None = None
        self.phase = "start"
        self._progress_tick = time.monotonic()    # the last progress, on the monotonic clock
        self.slowest_step_s: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stacks = None
        self._groups: dict = {}
        self._monitor = hangs.HangMonitor(beat_s)

    # ---------------------------------------------------------------- the training thread
    def progress(self, step: int | None = None, phase: str | None = None) -> None:
        if step is not None:
            self.step = step
        if phase is not None:
            self.phase = phase
        self._progress_tick = time.monotonic()

    def step_done(self, step: int, seconds: float) -> None:
        if self.start_step is None:
            self.start_step = step - 1
        if self.slowest_step_s is None or seconds > self.slowest_step_s:
            self.slowest_step_s = seconds
        self.step, self.phase, self._progress_tick = step, "step", time.monotonic()

    @property
    def idle_s(self) -> float:
        """Seconds since this rank's last progress (monotonic: see the module's docstring)."""
        return time.monotonic() - self._progress_tick

    @property
    def limit_s(self) -> float:
        return hang_limit(self.configured, self.device, self.slowest_step_s,
                          self.step is not None and self.step > (self.start_step or 0),
                          self.init_timeout_s)

    def start(self, start_step: int | None = None) -> "Watchdog":
        self.start_step = start_step
        self.step = start_step
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.dump_stacks:
            self._stacks = open(hangs.stacks_path(self.dir, self.rank), "a")
            faulthandler.register(DUMP_SIGNAL, file=self._stacks, all_threads=True, chain=False)
        self._beat()
        self._thread = threading.Thread(target=self._run, name="hpctrain-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self, exiting: bool = False) -> None:
        """Stop beating. ``exiting``: the attempt ended as every rank agreed (finished,
        preempted, out of time), so the last beat says the process is on its way out
        (``heartbeat.EXITING``): an interpreter slow to exit on a loaded node is then not
        taken for a hung rank. A rank that failed stops without it: if its exit hangs, it is
        still the one to blame."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if exiting:
            self.progress(phase=EXITING)
            try:
                self._beat()
            except OSError:
                pass            # no last beat: the watcher judges this rank as before
        if self._stacks is not None:
            faulthandler.unregister(DUMP_SIGNAL)
            path = Path(self._stacks.name)
            self._stacks.close()
            if path.exists() and path.stat().st_size == 0:
                path.unlink()

    # ---------------------------------------------------------------- the side thread
    def _beat(self) -> None:
        counts, members = collective_counts(self._groups)
        now = time.time()
        write_beat(self.dir, Beat(rank=self.rank, node=self.node, pid=os.getpid(), step=self.step,
                                  start_step=self.start_step, phase=self.phase,
                                  progress_at=now - self.idle_s, beat_at=now,
                                  limit_s=self.limit_s, collectives=counts, members=members,
                                  where=main_thread_where()))

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self._beat()
                verdict = hangs.read_verdict(self.dir) or self._decide()
            except OSError:
                continue        # a shared filesystem hiccup: try again at the next beat
            if verdict is not None and not self._stop.is_set():
                self._act(verdict)

    def _decide(self) -> hangs.Verdict | None:
        """Decide here only when this rank itself has been idle for the limit (a hung job stops
        every rank), and with a watcher present only when it seems to be gone."""
        idle = self.idle_s
        limit = self.limit_s
        if idle <= (2 * limit + WATCHER_GRACE_S if self.watcher else limit):
            return None
        from ..health.heartbeat import read_beats
        self._monitor.update(read_beats(self.dir), time.monotonic())
        verdict = self._monitor.check(time.monotonic(), decided_by=f"rank {self.rank}")
        if verdict is None:
            return None
        verdict.stacks = str(self.dir / hangs.STACKS_PATTERN) if self.dump_stacks else ""
        verdict = hangs.claim_verdict(self.dir, verdict)
        self._wake_silent_neighbours(verdict)
        return verdict

    def _wake_silent_neighbours(self, verdict: hangs.Verdict) -> None:
        """Silent ranks on this node (stopped): SIGQUIT for their stacks, then SIGCONT so they
        run, see the verdict and exit."""
        for rank, state in verdict.ranks.items():
            beat = self._monitor.beats.get(int(rank))
            if beat is None or beat.node != self.node or int(rank) == self.rank or \
                    (state.get("silent_s") or 0) <= self._monitor.silent_after_s:
                continue
            for sig in ((DUMP_SIGNAL,) if self.dump_stacks else ()) + (signal.SIGCONT,):
                try:
                    os.kill(beat.pid, sig)
                except OSError:
                    pass

    def _act(self, verdict: hangs.Verdict) -> None:
        """Dump this rank's stacks (unless the watcher's SIGQUIT already did), then exit."""
        self.log(f"hang: {verdict.message}; rank {self.rank} dumps its stacks and exits")
        if self.dump_stacks and self._stacks is not None:
            if self.watcher:        # the watcher's SIGQUIT is on its way
                deadline = time.monotonic() + 3 * self.beat_s
                while time.monotonic() < deadline and self._stacks.tell() == 0 and \
                        os.path.getsize(self._stacks.name) == 0:
                    time.sleep(0.2)
            if os.path.getsize(self._stacks.name) == 0:
                self._stacks.write(f"rank {self.rank} on {self.node} (pid {os.getpid()}), "
                                   f"{time.strftime('%H:%M:%S')}: Python stacks\n")
                self._stacks.flush()
                faulthandler.dump_traceback(file=self._stacks, all_threads=True)
            self._py_spy()
            self._stacks.write(f"{END_OF_STACKS} {self.rank}\n")
            self._stacks.flush()
            self._wait_for_peers_stacks(verdict)
        if self.on_verdict is not None:
            try:
                self.on_verdict(verdict)
            except Exception as e:  # noqa: BLE001 - exiting matters more than the record
                self.log(f"could not record the hang: {e}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_codes.HUNG)

    def _wait_for_peers_stacks(self, verdict: hangs.Verdict) -> None:
        """The first rank to exit makes srun end the others: wait (a while) until every rank
        has finished writing its stacks."""
        deadline = time.monotonic() + PEERS_WAIT_S
        for rank in verdict.ranks:
            path = hangs.stacks_path(self.dir, int(rank))
            while time.monotonic() < deadline:
                try:
                    text = reader.read_text(path, limits.RUN_LOG_BYTES, strict=False)
                    if text is not None and f"{END_OF_STACKS} {rank}\n" in text:
                        break
                except reader.DamagedFile:
                    pass
                time.sleep(0.5)

    def _py_spy(self) -> None:
        """Native frames too (C++, CUDA, NCCL), when py-spy is installed.

        Native unwinding samples threads that may be moving (a rank freeing tensors, a
        communication thread): py-spy then fails now and then with a libunwind error
        (``UNW_EINVAL``) where the next try succeeds. So up to ``PY_SPY_TRIES`` tries within
        ``PY_SPY_TIMEOUT_S``; the file gets the first good dump, or the last failure."""
        exe = shutil.which("py-spy")
        if exe is None:
            return
        _allow_tracing_by_children()
        self._stacks.write(f"\nrank {self.rank}: py-spy dump --native\n")
        self._stacks.flush()
        self._stacks.write(native_dump(exe, os.getpid()))
        self._stacks.flush()


def native_dump(exe: str, pid: int, tries: int = PY_SPY_TRIES,
                timeout_s: float = PY_SPY_TIMEOUT_S) -> str:
    """``py-spy dump --native`` of ``pid``: the first successful output, else the last
    failure (with how many tries it took)."""
    deadline = time.monotonic() + timeout_s
    out = ""
    for attempt in range(1, tries + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            done = subprocess.run([exe, "dump", "--native", "--pid", str(pid)],
                                  capture_output=True, text=True, errors="replace",
                                  timeout=left, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            out = f"py-spy failed: {e}\n"
            continue
        out = done.stdout + done.stderr
        if done.returncode == 0:
            return out
        out += f"py-spy failed (exit {done.returncode}, try {attempt} of {tries})\n"
        if attempt < tries:
            time.sleep(0.2)
    return out


def _allow_tracing_by_children() -> None:
    """Where Yama restricts ptrace to descendants, a child may not trace its parent unless the
    parent allows it (PR_SET_PTRACER)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)
    except (OSError, AttributeError):
        pass
