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
  With ``resilience`` settings (``in_job_restart``), a step that ended abnormally may instead
  be restarted inside the allocation: the culprit node left out, a quick-checked spare in its
  place; a new attempt of the same job is begun and ``HPCTRAIN_RESTART=1`` printed with its
  number, rendezvous and ``HPCTRAIN_STEP_NODES``, and the shell runs the training step again.
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
from dataclasses import dataclass
from pathlib import Path

from ... import exit_codes, limits
from ...errors import HpcTrainError
from ...exit_codes import ExitReason
from ...health.hang import read_verdict
from ...health.heartbeat import read_beats
from ...identity import free_port
from ...config.resilience import effective as effective_resilience
from ...record.attempt_end import (finish_attempt, hang_details, newest_recovery_s, read_restart,
                                   record_lost_attempts)
from ...record.attempt_records import Decision
from ...record.folder import RunFolder
from . import commands, in_job_restart
from .node_exclusion import (ExclusionPlan, exclusion_that_fits, job_node_count, node_usable,
                             nodes_to_ask)


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
    for lost in record_lost_attempts(run, attempt, scheduler="slurm"):
        print(f"[hpctrain] attempt {lost} of run {run.id} ended without its ledger record "
              f"(its batch shell was killed first): recorded now", file=sys.stderr)
    attempt_dir = run.attempt_dir(attempt)
    values = {
        "HPCTRAIN_ATTEMPT": attempt,
        "HPCTRAIN_ATTEMPT_DIR": attempt_dir,
        "HPCTRAIN_SIGNAL_FLAG": attempt_dir / "signal.flag",
        "MASTER_ADDR": first_node_address(),
        "MASTER_PORT": free_port(),
    }
    step_nodes = training_nodes(run)
    if step_nodes:
        values["HPCTRAIN_STEP_NODES"] = ",".join(step_nodes)
    end = job_end_time(job_id) if job_id else None
    if end:
        values["HPCTRAIN_DEADLINE"] = int(end)
    run.event("attempt_start", attempt=attempt, job_id=job_id,
              restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
              nodes=os.environ.get("SLURM_JOB_NODELIST", ""))
    out = _assign(**values)
    return out + "export " + " ".join(values) + "\n"


def training_nodes(run: RunFolder) -> list[str]:
    """With spare nodes: the first slurm.nodes of the allocation train, the rest wait (empty
    without spares: the step takes the whole allocation, as srun chooses)."""
    if effective_resilience(run.resolved_job(), run.resolved_profile()).spare_nodes <= 0:
        return []
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    nodes = commands.expand_hostlist(nodelist) if nodelist else []
    return nodes[:run.resolved_profile().slurm.nodes]


def _step_nodes() -> list[str]:
    """The nodes the training step that just ended ran on."""
    listed = os.environ.get("HPCTRAIN_STEP_NODES") or os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        return commands.expand_hostlist(listed) if listed else []
    except Exception:  # noqa: BLE001
        return [listed] if listed else []


def _scheduler_facts() -> dict:
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        nodes = commands.expand_hostlist(nodelist) if nodelist else []
    except Exception:
        nodes = [nodelist] if nodelist else []
    if os.environ.get("HPCTRAIN_STEP_NODES"):
        nodes = _step_nodes()
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
        if code != exit_codes.FINISHED else None
    restart = consider_restart(run, attempt, code, verdict, evidence, facts)
    record, decision = finish_attempt(
        run, attempt, code, started_at=started, task_exits=task_exits[:8] or None,
        evidence=None if verdict is not None else evidence,
        restart=restart.decision if restart else None, **facts, **more)
    if restart and decision is restart.decision:
        print(f"[hpctrain] attempt {attempt}: {record.exit_reason} at step {record.end_step}; "
              f"{decision.reason}", file=sys.stderr)
        return begin_restart(run, attempt, restart, record)
    print(f"[hpctrain] attempt {attempt}: {record.exit_reason} at step {record.end_step}; "
          f"{'requeue' if decision.requeue else 'stop'}: {decision.reason}", file=sys.stderr)
    if record.message and record.exit_reason in (ExitReason.HUNG, ExitReason.STRAGGLER):
        print(f"[hpctrain] {record.message}", file=sys.stderr)
    leave_out = record.excluded_nodes if record.exit_reason in (
        ExitReason.HUNG, ExitReason.STRAGGLER) else None
    if decision.requeue and restart_settings(run).spare_nodes > 0 and record.exit_reason in \
            in_job_restart.RESTART_REASONS:
        # the nodes this allocation already left out, and the culprit of this failure
        culprit = (record.first_failure or {}).get("node")
        left = [n for d in restarts_so_far(run, attempt) for n in d.get("excluded", [])]
        leave_out = list(dict.fromkeys(left + list(leave_out or []) + ([culprit] if culprit
                                                                       else [])))
    if decision.requeue and leave_out:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # see cmd_gate_failed
        why = {ExitReason.HUNG: "hung rank", ExitReason.STRAGGLER: "straggler node"}.get(
            record.exit_reason, "failed in this allocation")
        requeue_excluding(run, attempt, facts["job_id"], leave_out, reason=why)
        return _assign(HPCTRAIN_REQUEUE=0)
    return _assign(HPCTRAIN_REQUEUE=int(decision.requeue))


def restart_settings(run: RunFolder):
    return effective_resilience(run.resolved_job(), run.resolved_profile())


def restarts_so_far(run: RunFolder, attempt: int, ledger: list | None = None) -> list[dict]:
    """The in-job restarts of this allocation: the ledger's (``ledger``: the run's, read here
    unless the caller read it already), and the one that began ``attempt`` (its record is not
    written yet)."""
    from ...record.attempt_records import AttemptRecord
    records = [AttemptRecord.from_dict(r) for r in (run.ledger() if ledger is None else ledger)
               if isinstance(r, dict)]
    done = in_job_restart.restarts_in_job(records, job_id_of_run() or None)
    began = read_restart(run, attempt)
    if began is not None:
        done.append(began)
    return done


@dataclass
class Restart:
    plan: in_job_restart.RestartPlan
    decision: Decision
    failed_at: float
    overlap: bool = False        # an old step left to Slurm still counts its resources


def consider_restart(run: RunFolder, attempt: int, code: int, verdict, evidence: dict | None,
                     facts: dict) -> Restart | None:
    """The in-job restart after this attempt's step ended, or None (the requeue path decides).
    Plans (``in_job_restart.plan``), waits for the old step to be gone, quick-checks the
    replacements; says why when it does not restart."""
    settings = restart_settings(run)
    if settings.max_in_job_restarts <= 0 or code == exit_codes.FINISHED:
        return None
    try:
        return _consider_restart(run, attempt, code, verdict, evidence or {}, facts, settings)
    except Exception as e:  # noqa: BLE001 - the requeue path still works
        print(f"[hpctrain] no in-job restart: {e}", file=sys.stderr)
        return None


def _ended_reason(run: RunFolder, attempt: int, code: int, verdict) -> ExitReason | str:
    from ...record.attempt_end import read_result
    if verdict is not None:
        return ExitReason.HUNG
    result = read_result(run, attempt)
    if result.straggler:
        return ExitReason.STRAGGLER
    why = result.exit_reason or exit_codes.reason_for(code)
    if why == ExitReason.FINISHED and code != exit_codes.FINISHED:
        why = exit_codes.reason_for(code)
    return why


def _consider_restart(run, attempt, code, verdict, evidence, facts, settings) -> Restart | None:
    from ...record.attempt_end import first_failure, read_result
    job_id = facts["job_id"]
    profile = run.resolved_profile()
    reason = _ended_reason(run, attempt, code, verdict)
    if reason not in in_job_restart.RESTART_REASONS or run.cancelled():
        return None     # preempted, deadline, finished, unstable: the requeue path as always
    step_nodes = facts["nodes"]
    info = commands.job_info(os.environ.get("SLURM_JOB_ID", job_id))
    listed = info.get("NodeList", "")
    allocation = commands.expand_hostlist(listed) if listed not in ("", "(null)") else step_nodes
    states = commands.node_states(",".join(allocation)) if allocation else {}
    end = parse_slurm_time(info.get("EndTime", ""))
    result = read_result(run, attempt)
    if verdict is not None:
        failure, excluded = {"node": verdict.node, "rank": verdict.rank,
                             "message": verdict.message}, [verdict.node] if verdict.node else []
        failed_at = verdict.detected_at
    else:
        found = first_failure(run, attempt, task_exits=evidence.get("task_exits"),
                              last_beats=evidence.get("last_beats"),
                              silent_nodes=evidence.get("silent_nodes"))
        failure = found.to_dict() if found else None
        excluded = [result.straggler["node"]] if result.straggler else []
        failed_at = found.time if found and isinstance(found.time, (int, float)) else time.time()
    answered = {e.get("node") for e in evidence.get("task_exits") or [] if isinstance(e, dict)}
    culprits, why = in_job_restart.culprit_nodes(reason, failure, excluded,
                                                 evidence.get("silent_nodes"), step_nodes,
                                                 answered)
    preempting = (run.attempt_dir(attempt) / "signal.flag").exists() or \
        info.get("PreemptTime", "None") not in ("None", "", "Unknown")
    ledger = run.ledger()          # read once: nothing else writes it while the shell decides
    done = restarts_so_far(run, attempt, ledger)
    plan, note = in_job_restart.plan(
        reason=reason, spare_nodes=settings.spare_nodes,
        max_restarts=settings.max_in_job_restarts, done=done,
        culprits=culprits, why=why, step_nodes=step_nodes, allocation=allocation,
        states=states, time_left_s=(end - time.time()) if end else None,
        lead_time_s=profile.preemption.lead_time_s,
        restart_cost_s=newest_recovery_s(ledger, restarts_only=True),
        preempting=preempting)
    if plan is None:
        print(f"[hpctrain] no in-job restart: {note}", file=sys.stderr)
        run.event("in_job_restart_refused", attempt=attempt, reason=note)
        return None
    lost = {n for n in step_nodes if n not in allocation or not node_usable(states.get(n, "DOWN"))}
    gone, stale = in_job_restart.stop_old_step(os.environ.get("SLURM_JOB_ID", job_id),
                                               lost=lost & set(plan.excluded))
    if not gone:
        print(f"[hpctrain] no in-job restart: task step(s) {', '.join(stale)} of the failed "
              "attempt still running after being killed", file=sys.stderr)
        return None
    if stale:
        print(f"[hpctrain] step(s) {', '.join(stale)} of the failed attempt span "
              f"{', '.join(sorted(lost & set(plan.excluded)))}, which Slurm lost: left to "
              "Slurm, the new steps share their resources (srun --overlap)", file=sys.stderr)
        run.event("old_step_left", attempt=attempt, steps=stale,
                  nodes=sorted(lost & set(plan.excluded)))
    check_nodes = plan.spares or plan.nodes
    ok, out = in_job_restart.quick_check(str(run.path), check_nodes, sys.executable,
                                         profile.preflight.timeout_s + 60, overlap=bool(stale))
    if not ok:
        print(f"[hpctrain] no in-job restart: the node check of {', '.join(check_nodes)} "
              f"failed:\n{out}", file=sys.stderr)
        run.event("in_job_restart_refused", attempt=attempt, reason="node check failed",
                  nodes=check_nodes, output=out[-500:])
        return None
    run.event("node_check", attempt=attempt, nodes=check_nodes, passed=True,
              output=out[-500:])
    budget = len(done) + 1
    decision = Decision(False, f"{plan.describe()}; in-job restart {budget} of "
                               f"{settings.max_in_job_restarts}", in_job=True)
    return Restart(plan, decision, failed_at, overlap=bool(stale))


def begin_restart(run: RunFolder, attempt: int, restart: Restart, record) -> str:
    """A new attempt of the same job on the plan's nodes: its folder, rendezvous, how it got
    there (``restart.json``, completed in its ledger record), the shell's assignments."""
    from ...record.attempt_end import write_restart
    new = run.begin_attempt()
    attempt_dir = run.attempt_dir(new)
    plan = restart.plan
    write_restart(run, new, {"after_attempt": attempt, "failed_at": restart.failed_at,
                             **plan.to_dict()})
    values = {
        "HPCTRAIN_ATTEMPT": new,
        "HPCTRAIN_ATTEMPT_DIR": attempt_dir,
        "HPCTRAIN_SIGNAL_FLAG": attempt_dir / "signal.flag",
        "MASTER_ADDR": node_ip(plan.nodes[0]),
        "MASTER_PORT": free_port(),
        "HPCTRAIN_STEP_NODES": ",".join(plan.nodes),
        "HPCTRAIN_STEP_OVERLAP": "1" if restart.overlap else "",
    }
    run.event("attempt_start", attempt=new, job_id=job_id_of_run(),
              restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
              nodes=",".join(plan.nodes), in_job_restart=plan.to_dict())
    out = _assign(**values, HPCTRAIN_RESTART=1, HPCTRAIN_REQUEUE=0)
    return out + "export " + " ".join(values) + "\n"


def node_ip(node: str) -> str:
    addr = commands.node_address(node)
    try:
        return socket.getaddrinfo(addr, None, socket.AF_INET)[0][4][0]
    except socket.gaierror:
        raise HpcTrainError(f"the node {node!r} has address {addr!r}, which does not resolve "
                            "on this host; fix the node's NodeAddr or DNS")


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
    the event's ``not_excluded`` and ``note`` say which stayed in and why. A job that holds
    spare nodes (``resilience.spare_nodes``) may give spares up for that: it needs only the
    nodes it trains on, and asks for N + the spares the partition still has besides the
    excluded nodes (``nodes_to_ask``; the event's ``nodes``). Once the hold is in
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
    excluded, problem, plan, resized = [], None, None, None
    least, spares = _training_and_spares(run)
    try:
        if bad:
            info = info or commands.job_info(job_id)
            listed = info.get("ExcNodeList", "")
            current = commands.expand_hostlist(listed) if listed not in ("", "(null)") else []
            plan = _exclusion_plan(info, bad, current, needed=least)
            if plan.note:
                print(f"[hpctrain] {plan.note}", file=sys.stderr)
            if plan.exclude:
                commands.exclude_nodes(job_id, sorted(set(current + plan.exclude)))
            excluded = plan.exclude
            if least is not None:
                resized = _ask_fewer_spares(job_id, info, least, least + spares,
                                            plan.usable_left)
    except Exception as e:  # noqa: BLE001 - recorded; the release below still happens
        problem = f"excluding {', '.join(bad)} failed: {e}"
        print(f"[hpctrain] {problem}; releasing the job without the exclusion", file=sys.stderr)
    finally:
        released, release_error = _release(job_id, pause_s)
    data = {"attempt": attempt, "job_id": job_id, "excluded": excluded, "reason": reason}
    if resized is not None:
        data["nodes"] = resized
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


def _training_and_spares(run: RunFolder) -> tuple[int | None, int]:
    """(N, S): the nodes the job trains on and its spares; (None, 0) without spares (or
    when the run's files cannot say: the job then keeps the node count it has)."""
    try:
        spares = restart_settings(run).spare_nodes
        return (run.resolved_profile().slurm.nodes, spares) if spares > 0 else (None, 0)
    except Exception as e:  # noqa: BLE001 - the requeue goes on as without spares
        print(f"[hpctrain] could not read the run's spare nodes: {e}", file=sys.stderr)
        return None, 0


def _ask_fewer_spares(job_id: str, info: dict, least: int, asked: int,
                      usable_left: int | None) -> int | None:
    """Make the held job ask for ``nodes_to_ask`` nodes when that is fewer than it asked for
    (tasks and CPUs in proportion, as sbatch counted them per node); the count, or None when
    it stays. Slurm shows a requeued job's old NumNodes until it runs again: the log says
    what was set."""
    count = nodes_to_ask(asked, least, usable_left)
    if count >= asked:
        return None
    had = job_node_count(info) or asked
    per_node = {key: int(info[key]) // had for key in ("NumTasks", "NumCPUs")
                if str(info.get(key, "")).isdigit() and int(info[key]) >= had}
    commands.resize_pending_job(job_id, nodes=count, tasks=per_node.get("NumTasks", 0) * count,
                                cpus=per_node.get("NumCPUs", 0) * count)
    print(f"[hpctrain] the requeued job asks for {count} node(s) instead of {asked}: "
          f"{asked - count} spare(s) fewer, the partition has {usable_left} usable node(s) "
          "besides the excluded", file=sys.stderr)
    return count


def _exclusion_plan(info: dict, bad: list[str], current: list[str],
                    needed: int | None = None) -> ExclusionPlan:
    """Which of ``bad`` to exclude so that the job can still start (``node_exclusion``). When
    the partition cannot be read, all of them, as asked, and the note says the count was not
    checked."""
    try:
        return exclusion_that_fits(info, bad, current, needed=needed)
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
