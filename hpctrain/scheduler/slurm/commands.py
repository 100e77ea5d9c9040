"""The one place that runs Slurm's commands (sbatch, squeue, sacct, scontrol, scancel).

Everything that turns their output into data is a pure ``parse_*`` function, tested on real
output; the runners here are thin. A missing command or a refusal becomes a
``SubmissionError``/``HpcTrainError`` carrying exactly what Slurm said.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from ...errors import HpcTrainError, SubmissionError

TIMEOUT_S = 60


def run(argv: list[str], *, check: bool = True, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise HpcTrainError(f"`{argv[0]}` is not on PATH: is this a Slurm login node? "
                            "(for this machine, use --profile local; for the dev cluster run "
                            "tools/dev_cluster start and export SLURM_CONF)")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HpcTrainError(f"`{' '.join(argv)}` did not answer within {timeout:.0f} s "
                            "(is slurmctld up?)") from None
    if check and proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip()
        raise SubmissionError(f"{argv[0]} failed: {said}" if said else
                              f"{argv[0]} failed with exit code {proc.returncode}")
    return proc


def sbatch_test_only(script_path: str) -> str:
    """``sbatch --test-only``: Slurm's own verdict on a script, without queueing it."""
    proc = run(["sbatch", "--test-only", script_path], check=False)
    out = (proc.stderr + proc.stdout).strip()
    if proc.returncode != 0:
        raise SubmissionError(f"sbatch --test-only refused the script: {out}")
    return out


# ---- squeue -----------------------------------------------------------------------------------

_SQUEUE_FORMAT = "%i|%j|%T|%r|%P|%N|%D|%M|%l|%S|%e"


@dataclass
class QueueEntry:
    job_id: str
    name: str
    state: str
    reason: str
    partition: str
    nodes: str
    num_nodes: str
    time_used: str
    time_limit: str
    start_time: str
    end_time: str


def parse_squeue(text: str) -> list[QueueEntry]:
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 11:
            continue
        out.append(QueueEntry(*parts[:11]))
    return out


def squeue(job_ids: list[str]) -> list[QueueEntry]:
    if not job_ids:
        return []
    # -r: one line per array task (a pending array is otherwise folded into "12_[1-3%2]")
    proc = run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", _SQUEUE_FORMAT], check=False)
    if proc.returncode != 0:  # squeue refuses ids it has forgotten; that is "not in queue"
        return []
    return parse_squeue(proc.stdout)


def parse_duration(text: str) -> int | None:
    """Slurm's durations (squeue %M/%l, sacct Elapsed: ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``),
    read by the whole grammar of its time values (``minutes``, ``minutes:seconds``,
    ``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes``,
    ``days-hours:minutes:seconds``) -> seconds; None for ``UNLIMITED``, ``N/A``, ``INVALID``
    and anything else unreadable."""
    text = (text or "").strip()
    days = None
    if "-" in text:
        head, text = text.split("-", 1)
        if not head.isdigit():
            return None
        days = int(head)
    parts = text.split(":")
    if len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    nums = [int(p) for p in parts]
    if days is not None:         # after a day count, the fields start at the hours
        h, m, s = nums + [0] * (3 - len(nums))
    elif len(nums) == 1:         # a lone number is minutes
        h, m, s = 0, nums[0], 0
    else:
        h, m, s = [0] * (3 - len(nums)) + nums
    return (((days or 0) * 24 + h) * 60 + m) * 60 + s


# ---- sacct ----------------------------------------------------------------------------------

SACCT_FIELDS = ["JobID", "JobName", "State", "ExitCode", "Elapsed", "Start", "End", "NodeList",
                "Partition", "Reason"]


def parse_sacct(text: str) -> list[dict]:
    """``sacct --parsable2 -o <SACCT_FIELDS>`` (with header) -> one dict per line (steps too)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    return [dict(zip(header, ln.split("|"))) for ln in lines[1:]]


def sacct(job_ids: list[str], *, duplicates: bool = False) -> list[dict]:
    """Accounting rows of the jobs (``duplicates``: every requeued incarnation too)."""
    if not job_ids:
        return []
    argv = ["sacct", "--parsable2", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(job_ids)]
    if duplicates:
        argv.append("--duplicates")
    proc = run(argv, check=False)
    if proc.returncode != 0:
        return []
    return parse_sacct(proc.stdout)


def sacct_usage(job_ids: list[str]) -> list[dict]:
    """What each allocation of the jobs used: ``JobID``, ``ElapsedRaw`` (seconds) and
    ``AllocTRES`` (``gres/gpu=N``), one row per incarnation of a requeued job (allocations
    only, no steps). Empty when accounting is not there."""
    if not job_ids:
        return []
    proc = run(["sacct", "--parsable2", "-X", "--duplicates", "-o", "JobID,ElapsedRaw,AllocTRES",
                "-j", ",".join(job_ids)], check=False)
    return parse_sacct(proc.stdout) if proc.returncode == 0 else []


# ---- srun ------------------------------------------------------------------------------------

_TASK_EXIT = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,-]+): "
                        r"(?:Exited with exit code (?P<code>\d+)|(?P<signal>[A-Za-z][A-Za-z ]+))$")


def parse_srun_task_exits(text: str) -> list[dict]:
    """srun's per-task failure lines (``srun: error: n2: task 2: Exited with exit code 1``,
    ``... task 1: Terminated``), in order: which task ended first and how."""
    out = []
    for line in text.splitlines():
        m = _TASK_EXIT.match(line.strip())
        if m:
            out.append({"node": m["node"], "tasks": m["tasks"],
                        "exit_code": int(m["code"]) if m["code"] else None,
                        "signal": m["signal"].strip() if m["signal"] else None})
    return out


def step_exit_code(srun_code: int, task_exits: list[dict]) -> int:
    """The code that says why a step ended. With --kill-on-bad-exit srun may report the
    signal it used on the surviving tasks (143); the first task that exited on its own knows."""
    if srun_code > 128 or srun_code < 0:
        for t in task_exits:
            if t["exit_code"]:
                return t["exit_code"]
    return srun_code


# ---- scontrol / scancel -------------------------------------------------------------------


def parse_scontrol_record(text: str) -> dict:
    """``scontrol show node|job X`` (Key=Value pairs over several lines) -> dict."""
    out: dict[str, str] = {}
    for token in text.split():
        if "=" in token:
            k, v = token.split("=", 1)
            out.setdefault(k, v)
    return out


def node_address(node: str) -> str:
    """The address Slurm uses for a node (NodeAddr), which may differ from its name."""
    proc = run(["scontrol", "show", "node", node])
    return parse_scontrol_record(proc.stdout).get("NodeAddr", node)


def expand_hostlist(hostlist: str) -> list[str]:
    proc = run(["scontrol", "show", "hostnames", hostlist])
    return [h for h in proc.stdout.split() if h]


def parse_node_states(text: str) -> dict[str, str]:
    """``scontrol show node [LIST]`` (one record per node) -> {node name: State}."""
    states: dict[str, str] = {}
    name = None
    for token in text.split():
        key, _, value = token.partition("=")
        if key == "NodeName":
            name = value
        elif key == "State" and name is not None and name not in states:
            states[name] = value
    return states


def parse_partition_nodes(text: str) -> str:
    """``scontrol show partition P`` -> its ``Nodes=`` hostlist ("" when it has none)."""
    nodes = parse_scontrol_record(text).get("Nodes", "")
    return "" if nodes in ("(null)", "") else nodes


def partition_hostlist(partition: str) -> str:
    """The partition's nodes as a hostlist (``n[1-3]``; raises when Slurm does not know it)."""
    return parse_partition_nodes(run(["scontrol", "show", "partition", partition]).stdout)


def node_states(hostlist: str) -> dict[str, str]:
    """{node: State} of the nodes of ``hostlist``, in one ``scontrol show node`` call."""
    if not hostlist:
        return {}
    return parse_node_states(run(["scontrol", "show", "node", hostlist]).stdout)


# A Slurm job id as hpctrain hands it to Slurm's commands: a job (177), an array task (177_3)
# or a range of them (177_[0-3]), a step (177.0), a heterogeneous component (177+1). It starts
# with a digit, so a run record edited to hold ``--user=alice`` cannot become an option of
# scancel (which would cancel every job of that user), and it has no space or ``=``.
JOB_ID_RE = re.compile(r"[0-9][0-9_.+\[\],-]*")


def acted_on(ids) -> list[str]:
    """``ids`` checked at the one door before a command that acts on jobs (scancel, scontrol
    requeue/update) gets them (raises on anything else; reading commands take any text as
    the value of their ``-j``)."""
    out = []
    for job_id in ids:
        if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id) or len(job_id) > 200:
            shown = job_id[:40] if isinstance(job_id, str) else type(job_id).__name__
            raise HpcTrainError(f"{shown!r} is not a Slurm job id (digits, with _N, .N or +N); "
                                f"the run's records may be damaged (see `hpctrain status RUN`)")
        out.append(job_id)
    return out


def job_info(job_id: str) -> dict:
    proc = run(["scontrol", "show", "job", job_id], check=False)
    if proc.returncode != 0:
        return {}
    return parse_scontrol_record(proc.stdout)


def requeue(job_id: str) -> None:
    run(["scontrol", "requeue", *acted_on([job_id])])


def exclude_nodes(job_id: str, nodes: list[str]) -> None:
    """Add nodes to a job's exclude list (the job must be pending or be requeued after)."""
    (job_id,) = acted_on([job_id])
    run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"])


def resize_pending_job(job_id: str, *, nodes: int, tasks: int = 0, cpus: int = 0) -> None:
    """Change a pending (held, requeued) job's node count; its task and CPU counts with it
    (0: left as they are): Slurm keeps a job whose tasks no longer fit its nodes pending for
    ever ("BadConstraints")."""
    (job_id,) = acted_on([job_id])
    argv = ["scontrol", "update", f"JobId={job_id}", f"NumNodes={nodes}"]
    if tasks:
        argv.append(f"NumTasks={tasks}")
    if cpus:
        argv.append(f"NumCPUs={cpus}")
    run(argv)


def cancel(ids: list[str], *, signal: str | None = None, full: bool = False) -> None:
    if not ids:
        return
    argv = ["scancel"]
    if signal:
        argv += ["--signal", signal]
    if full:
        argv.append("--full")
    run(argv + acted_on(ids))


def parse_step_ids(text: str) -> list[str]:
    """``squeue --steps -h -o %i`` -> the job steps that run tasks (``177.0``), not the batch
    or extern step."""
    out = []
    for line in text.split():
        job, _, step = line.partition(".")
        if step.isdigit():
            out.append(line)
    return out


def parse_step_nodes(text: str) -> dict[str, str]:
    """``squeue --steps -h -o "%i %N"`` -> {task step: its nodes as a hostlist} (not the
    batch or extern step)."""
    out = {}
    for line in text.splitlines():
        step, _, nodes = line.strip().partition(" ")
        if parse_step_ids(step):
            out[step] = nodes.strip()
    return out


def job_step_nodes(job_id: str) -> dict[str, list[str]]:
    """The job's running task steps and the nodes each spans."""
    proc = run(["squeue", "--steps", "-h", "-o", "%i %N", "-j", job_id], check=False)
    return {step: expand_hostlist(nodes) if nodes else []
            for step, nodes in parse_step_nodes(proc.stdout).items()}


def job_steps(job_id: str) -> list[str]:
    """The job's running task steps (``JOBID.N``)."""
    proc = run(["squeue", "--steps", "-h", "-o", "%i", "-j", job_id], check=False)
    return parse_step_ids(proc.stdout)
