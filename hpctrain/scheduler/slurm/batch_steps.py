"""Steps the batch shell delegates to Python: ``python -m hpctrain.scheduler.slurm.batch_steps <command>``.

They run in the batch shell on the first node, outside any container, and print shell
assignments that the script ``eval``s. Every printed value is ``shlex.quote``d, and only
names chosen here are assigned, so nothing from a profile or the environment can become code.

* ``begin RUN`` — claim the next attempt number, compute the rendezvous address (the first
  node's NodeAddr, checked to resolve: node names often do not), a free port, the job's end
  time (the runtime's deadline), the signal flag file. Prints ``HPCTRAIN_SKIP=1`` when the run
  has finished or was cancelled (a chained or requeued job then exits at once).
* ``watch RUN --attempt N --srun-pid PID`` — beside the training step: the hang watcher
  (``hang_watch``): on a hang, the verdict, every rank's stacks, the step ended.
* ``end RUN --attempt N --exit-code RC`` — write the ledger record and print
  ``HPCTRAIN_REQUEUE=0|1`` from the requeue policy (budget and progress). An attempt that hung,
  or stopped for a straggler node, is requeued here without that node (hold, exclude,
  release: ``requeue_excluding``), and ``HPCTRAIN_REQUEUE=0`` is printed.
* ``gate-failed RUN --attempt N --exit-code RC`` — the preflight gate failed: record it, add the
  bad nodes to the job's exclude list and requeue it (within the budget).
* ``signal RUN --signal SIG`` — the batch shell got SIG: pass it on now, or defer it (print
  ``HPCTRAIN_SIGNAL_ACTION=now|defer`` and the delay). Slurm delivers the time-limit warning
  up to a minute early; passing it on at once would cost up to a minute of every attempt, and a
  whole attempt when the limit is short. A preemption (Slurm sets the job's PreemptTime) or a
  signal far from the end (a person's drill) goes on at once.
* ``master-addr`` — the first node's address (for non-training steps).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import signal
import socket
import sys
import time
from pathlib import Path

from ... import exit_codes, limits
from ...errors import HpcTrainError
from ...exit_codes import ExitReason
from ...health.hang import read_verdict
from ...health.heartbeat import read_beats
from ...identity import free_port
from ...record.attempt_end import finish_attempt, hang_details
from ...record.folder import RunFolder
from . import commands
from .node_exclusion import ExclusionPlan, exclusion_that_fits


def _assign(**values) -> str:
    return "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in values.items())


def first_node_address() -> str:
    """Address of the allocation's first node, which must resolve: gloo/NCCL rendezvous there."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    nodes = commands.expand_hostlist(nodelist) if nodelist else []
    first = nodes[0] if nodes else socket.gethostname()
    addr = commands.node_address(first) if nodes else first
    try:
        infos = socket.getaddrinfo(addr, None, socket.AF_INET)
    except socket.gaierror:
        raise SystemExit(f"[hpctrain] the first node {first!r} has address {addr!r}, which does not "
                         "resolve on this host; fix the node's NodeAddr or DNS")
    return infos[0][4][0]


def parse_slurm_time(text: str) -> float | None:
    """squeue's %e (``2026-11-25T22:14:23``, local time) -> epoch seconds."""
    try:
        return _dt.datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def job_end_time(job_id: str) -> float | None:
    rows = commands.squeue([job_id])
    return parse_slurm_time(rows[0].end_time) if rows else None


def job_id_of_run() -> str:
    """The id the run recorded at submission: ``A_i`` for task i of job array A (a sweep), which
    Slurm also accepts everywhere; else ``SLURM_JOB_ID``."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID", "")


def cancelled(run: RunFolder) -> bool:
    return run.cancelled()  # a later `hpctrain requeue/resume` reopens the run


def finished(run: RunFolder) -> bool:
    return run.finished()


EARLY_WARNING_S = 75   # Slurm: "up to 60 seconds earlier than specified", plus its check period


def signal_action(now: float, end_time: float | None, lead_time_s: float, preempting: bool,
                  signal_name: str) -> tuple[str, float]:
    """("now", 0) to pass the signal to the ranks, or ("defer", seconds) to re-raise it later."""
    if signal_name == "TERM" or preempting or end_time is None:
        return "now", 0.0
    early = (end_time - now) - lead_time_s
    if 5.0 < early <= EARLY_WARNING_S:
        return "defer", round(early, 1)
    return "now", 0.0


def cmd_signal(run: RunFolder, signal_name: str) -> str:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    info = commands.job_info(job_id) if job_id else {}
    preempting = info.get("PreemptTime", "None") not in ("None", "", "Unknown")
    end = parse_slurm_time(info.get("EndTime", ""))
    lead = run.resolved_profile().preemption.lead_time_s
    action, delay = signal_action(time.time(), end, lead, preempting, signal_name)
    run.event("signal", signal=signal_name, action=action, delay_s=delay, preempting=preempting)
    return _assign(HPCTRAIN_SIGNAL_ACTION=action, HPCTRAIN_SIGNAL_DELAY=int(delay))


def cmd_begin(run: RunFolder) -> str:
    job_id = job_id_of_run()
    if cancelled(run):
        print(f"[hpctrain] run {run.id} was cancelled; job {job_id} exits", file=sys.stderr)
        return _assign(HPCTRAIN_SKIP=1)
    if finished(run):
        print(f"[hpctrain] run {run.id} already finished; job {job_id} exits", file=sys.stderr)
        return _assign(HPCTRAIN_SKIP=1)
    attempt = run.begin_attempt()
    attempt_dir = run.attempt_dir(attempt)
    values = {
        "HPCTRAIN_ATTEMPT": attempt,
        "HPCTRAIN_ATTEMPT_DIR": attempt_dir,
        "HPCTRAIN_SIGNAL_FLAG": attempt_dir / "signal.flag",
        "MASTER_ADDR": first_node_address(),
        "MASTER_PORT": free_port(),
    }
    end = job_end_time(job_id) if job_id else None
    if end:
        values["HPCTRAIN_DEADLINE"] = int(end)
    run.event("attempt_start", attempt=attempt, job_id=job_id,
              restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
              nodes=os.environ.get("SLURM_JOB_NODELIST", ""))
    out = _assign(**values)
    return out + "export " + " ".join(values) + "\n"


def _scheduler_facts() -> dict:
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        nodes = commands.expand_hostlist(nodelist) if nodelist else []
    except Exception:
        nodes = [nodelist] if nodelist else []
    return {"scheduler": "slurm", "job_id": job_id_of_run() or None,
            "restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0), "nodes": nodes}


def cmd_end(run: RunFolder, attempt: int, exit_code: int, started: float | None) -> str:
    from ...record import reader
    try:   # its end: srun's task exits are its last lines
        got = reader.tail_bytes(run.attempt_dir(attempt) / "batch.log", limits.RUN_LOG_BYTES)
    except reader.DamagedFile:
        got = None
    batch_log = reader.decode(got[0], "batch.log", strict=False) if got else ""
    task_exits = commands.parse_srun_task_exits(batch_log)
    code = commands.step_exit_code(exit_code, task_exits)
    verdict = read_verdict(run.attempt_dir(attempt))
    facts = _scheduler_facts()
    more = hang_details(verdict) if verdict is not None else {}
    evidence = failure_evidence(run, attempt, task_exits, facts["nodes"]) \
        if verdict is None and code != exit_codes.FINISHED else None
    record, decision = finish_attempt(run, attempt, code, started_at=started,
                                      task_exits=task_exits[:8] or None, evidence=evidence,
                                      **facts, **more)
    print(f"[hpctrain] attempt {attempt}: {record.exit_reason} at step {record.end_step}; "
          f"{'requeue' if decision.requeue else 'stop'}: {decision.reason}", file=sys.stderr)
    if record.message and record.exit_reason in (ExitReason.HUNG, ExitReason.STRAGGLER):
        print(f"[hpctrain] {record.message}", file=sys.stderr)
    leave_out = record.excluded_nodes if record.exit_reason in (
        ExitReason.HUNG, ExitReason.STRAGGLER) else None
    if decision.requeue and leave_out:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # see cmd_gate_failed
        why = "hung rank" if record.exit_reason == ExitReason.HUNG else "straggler node"
        requeue_excluding(run, attempt, facts["job_id"], leave_out, reason=why)
        return _assign(HPCTRAIN_REQUEUE=0)
    return _assign(HPCTRAIN_REQUEUE=int(decision.requeue))


def failure_evidence(run: RunFolder, attempt: int, task_exits: list[dict],
                     nodes: list[str]) -> dict:
    """What the batch shell saw of the ranks' ends, for naming the rank that failed first
    (``record.culprit``): srun's per-task exits, each rank's last heartbeat (node, time), and
    the step's nodes Slurm no longer hears from (a rank there died with its node, whatever its
    peers said)."""
    beats = {rank: (b.node, b.beat_at) for rank, b in read_beats(run.attempt_dir(attempt)).items()}
    silent = {}
    try:
        for node, state in commands.node_states(",".join(nodes)).items():
            if "*" in state or any(p in ("DOWN", "NOT_RESPONDING", "FAIL")
                                   for p in state.upper().split("+")):
                silent[node] = state
    except Exception as e:  # noqa: BLE001 - the ranks' own records still name someone
        print(f"[hpctrain] could not read the nodes' states: {e}", file=sys.stderr)
    return {"task_exits": task_exits, "last_beats": beats, "silent_nodes": silent}


def cmd_watch(run: RunFolder, attempt: int, srun_pid: int) -> int:
    from .hang_watch import watch
    watch(run, attempt, job_id_of_run(), srun_pid)
    return 0


def cmd_gate_failed(run: RunFolder, attempt: int, exit_code: int, started: float | None) -> int:
    report_file = run.path / "preflight" / f"attempt-{attempt}.json"
    from ...record import reader
    try:
        report = reader.read_json(report_file) or {}
    except reader.DamagedFile:
        report = {}
    bad_nodes = report.get("bad_nodes")
    bad = [str(n) for n in bad_nodes] if isinstance(bad_nodes, list) else []
    facts = _scheduler_facts()
    code = exit_code if exit_code == exit_codes.PREFLIGHT_FAILED else exit_codes.PREFLIGHT_FAILED
    record, decision = finish_attempt(
        run, attempt, code, reason=ExitReason.PREFLIGHT_FAILED, excluded_nodes=bad,
        preflight_report=str(report_file), started_at=started, **facts)
    print(f"[hpctrain] preflight failed on {', '.join(bad) or 'unknown nodes'}; "
          f"{'requeue' if decision.requeue else 'stop'}: {decision.reason}", file=sys.stderr)
    if not decision.requeue:
        return 0
    # Requeueing kills this shell's processes with SIGTERM; ignore it so the hold -> exclude ->
    # release sequence completes (a running job's exclude list cannot be changed).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return requeue_excluding(run, attempt, facts["job_id"], bad, reason="preflight gate")


RELEASE_TRIES = 5
RELEASE_PAUSE_S = 2.0


def requeue_excluding(run: RunFolder, attempt: int, job_id: str, bad: list[str],
                      pause_s: float = RELEASE_PAUSE_S, reason: str = "preflight gate") -> int:
    """Hold-requeue the job, add ``bad`` to its exclude list, release it. Only as many bad
    nodes are excluded as the partition can spare for the job's node count (``node_exclusion``):
    the event's ``not_excluded`` and ``note`` say which stayed in and why. Once the hold is in
    place the release happens whatever else fails (a failing ``scontrol update`` would leave
    the job held forever): the job then comes back without the exclusion, and the event says
    so. The attempt's ledger record, written before with the nodes asked for, is then made to
    say what happened (``_record_exclusion``). Returns 0 when the job was requeued and
    released, 1 otherwise."""
    # Read before the hold: a requeued job's NumNodes counts only its nodes still completing.
    info = _job_info_or_none(job_id) if bad else None
    try:
        commands.run(["scontrol", "requeuehold", job_id])
    except Exception as e:  # noqa: BLE001 - nothing is held: say so and stop
        print(f"[hpctrain] scontrol requeuehold {job_id} failed: {e}; the job is not requeued",
              file=sys.stderr)
        run.event("requeue_failed", attempt=attempt, job_id=job_id, reason=reason,
                  error=str(e))
        if bad:
            _record_exclusion(run, attempt, [], bad, f"not excluding {', '.join(bad)}: the job "
                              f"was not requeued (scontrol requeuehold failed: {e})")
        return 1
    excluded, problem, plan = [], None, None
    try:
        if bad:
            info = info or commands.job_info(job_id)
            listed = info.get("ExcNodeList", "")
            current = commands.expand_hostlist(listed) if listed not in ("", "(null)") else []
            plan = _exclusion_plan(info, bad, current)
            if plan.note:
                print(f"[hpctrain] {plan.note}", file=sys.stderr)
            if plan.exclude:
                commands.exclude_nodes(job_id, sorted(set(current + plan.exclude)))
            excluded = plan.exclude
    except Exception as e:  # noqa: BLE001 - recorded; the release below still happens
        problem = f"excluding {', '.join(bad)} failed: {e}"
        print(f"[hpctrain] {problem}; releasing the job without the exclusion", file=sys.stderr)
    finally:
        released, release_error = _release(job_id, pause_s)
    data = {"attempt": attempt, "job_id": job_id, "excluded": excluded, "reason": reason}
    if plan is not None and plan.not_excluded and not problem:
        data["not_excluded"] = plan.not_excluded
    if plan is not None and plan.note:
        data["note"] = plan.note
    if problem:
        data["problem"] = problem
        _record_exclusion(run, attempt, [], bad, "; ".join(
            filter(None, [plan.note if plan else None,
                          problem + ("; the job was released without the exclusion"
                                     if released else "")])))
    elif bad:
        _record_exclusion(run, attempt, excluded, plan.not_excluded if plan else [],
                          plan.note if plan else None)
    if not released:
        print(f"[hpctrain] scontrol release {job_id} failed {RELEASE_TRIES} times: "
              f"{release_error}; the job stays held: `scontrol release {job_id}` or "
              f"`hpctrain cancel {run.id}`", file=sys.stderr)
        run.event("requeue_failed", error=f"release failed: {release_error}", **data)
        return 1
    run.event("requeue", **data)
    return 0


def _record_exclusion(run: RunFolder, attempt: int, excluded: list[str], kept: list[str],
                      note: str | None) -> None:
    """Make the attempt's record say which bad nodes were really left out
    (``excluded_nodes``) and which stayed in and why (``not_excluded_nodes``,
    ``exclusion_note``): ``hpctrain status``, and the straggler watch of later attempts, read
    them. The requeue has happened by now: a record that cannot be written is only reported."""
    try:
        run.update_ledger_record(attempt, excluded_nodes=list(excluded),
                                 not_excluded_nodes=list(dict.fromkeys(kept)) or None,
                                 exclusion_note=note)
    except Exception as e:  # noqa: BLE001 - the job is requeued either way
        print(f"[hpctrain] could not record the exclusion in {run.ledger_file}: {e}",
              file=sys.stderr)


def _job_info_or_none(job_id: str) -> dict | None:
    try:
        return commands.job_info(job_id) or None
    except Exception:  # noqa: BLE001 - read again after the hold
        return None


def _exclusion_plan(info: dict, bad: list[str], current: list[str]) -> ExclusionPlan:
    """Which of ``bad`` to exclude so that the job can still start (``node_exclusion``). When
    the partition cannot be read, all of them, as asked, and the note says the count was not
    checked."""
    try:
        return exclusion_that_fits(info, bad, current)
    except Exception as e:  # noqa: BLE001 - the exclusion and the release go on
        return ExclusionPlan(list(bad), note=f"excluding {', '.join(bad)} without checking that "
                             f"the partition keeps enough usable nodes: {e}")


def _release(job_id: str, pause_s: float) -> tuple[bool, str | None]:
    error = None
    for i in range(RELEASE_TRIES):
        try:
            commands.run(["scontrol", "release", job_id])
            return True, None
        except Exception as e:  # noqa: BLE001 - slurmctld busy: try again
            error = str(e)
            if i + 1 < RELEASE_TRIES:
                time.sleep(pause_s)
    return False, error


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain.scheduler.slurm.batch_steps")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("begin")
    b.add_argument("run_dir")
    for name in ("end", "gate-failed"):
        e = sub.add_parser(name)
        e.add_argument("run_dir")
        e.add_argument("--attempt", type=int, required=True)
        e.add_argument("--exit-code", type=int, required=True)
        e.add_argument("--started", type=float, default=None)
    w = sub.add_parser("watch")
    w.add_argument("run_dir")
    w.add_argument("--attempt", type=int, required=True)
    w.add_argument("--srun-pid", type=int, required=True)
    sg = sub.add_parser("signal")
    sg.add_argument("run_dir")
    sg.add_argument("--signal", required=True)
    sub.add_parser("master-addr")
    args = ap.parse_args(argv)
    if args.cmd == "master-addr":
        sys.stdout.write(first_node_address() + "\n")
        return 0
    run = RunFolder(Path(args.run_dir))
    try:
        if args.cmd == "begin":
            sys.stdout.write(cmd_begin(run))
        elif args.cmd == "signal":
            sys.stdout.write(cmd_signal(run, args.signal.upper().removeprefix("SIG")))
        elif args.cmd == "end":
            sys.stdout.write(cmd_end(run, args.attempt, args.exit_code, args.started))
        elif args.cmd == "watch":
            return cmd_watch(run, args.attempt, args.srun_pid)
        else:
            return cmd_gate_failed(run, args.attempt, args.exit_code, args.started)
    except HpcTrainError as e:   # e.g. a damaged run.yaml: say which file, no traceback
        print(f"[hpctrain] Error: {e}", file=sys.stderr)
        return e.exit_code
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
