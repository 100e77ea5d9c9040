"""``train_main(run_dir)``: what every rank runs, under srun, submitit or a test launcher.

The contract with the submit side (``hpctrain.scheduler``) and the batch script:

* reads ``RUN/job.yaml`` and ``RUN/profile.yaml``; ranks from the launcher's environment
  (``hpctrain.identity``); ``HPCTRAIN_*`` variables for the attempt, deadline, signal;
* returns a summary dict when training finished;
* raises ``SystemExit(75)`` (PREEMPTED) after an emergency checkpoint (signal or deadline),
  ``SystemExit(3)`` (UNSTABLE) when the stability guard stopped the run, and lets crashes
  raise (the process exits non-zero; peers' collectives then fail at once);
* rank 0 writes ``logs/attempt-N/result.json`` at the end of every attempt, and under
  submitit's local executor also appends the ledger record and applies the requeue decision:
  every rank exits 144, which makes the local controller start the tasks again.

torch and megatron are imported inside the function only: submitit pickles this callable
in the submitting process, which must stay light.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from .. import exit_codes
from ..errors import HpcTrainError
from ..exit_codes import ExitReason

if TYPE_CHECKING:   # annotations only: this module must stay light to pickle (see above)
    from ..config import JobConfig
    from ..identity import RankEnv
    from ..record.attempt_records import AttemptResult
    from ..record.folder import RunFolder
    from .job_env import JobEnv
    from .loop import Outcome
    from .watchdog import Watchdog

STOP_CODES = {exit_codes.PREEMPTED, exit_codes.UNSTABLE, exit_codes.LOCAL_REQUEUE}


def attempt_number(run, requested: int | None) -> int:
    """``HPCTRAIN_ATTEMPT``, unless the ledger already holds that attempt (a task restarted by
    the local executor inherits the same environment): then the next free number."""
    recorded = [int(r.get("attempt", 0)) for r in run.ledger() if r.get("attempt") is not None]
    if requested is not None and requested not in recorded:
        return requested
    return max(recorded + [0]) + 1


def resolve_layout(job, profile, world_size: int):
    from ..config.layout import layout_problems
    from ..config.problems import Problems
    from ..errors import ConfigError

    if profile.world_size != world_size:
        raise HpcTrainError(f"the launcher started {world_size} ranks but profile "
                            f"{profile.name!r} describes {profile.world_size} "
                            f"({profile.slurm.nodes} node(s) × {profile.slurm.gpus_per_node}); "
                            f"the job script and the run's profile.yaml disagree")
    problems = Problems()
    layout = layout_problems(job, world_size, profile.slurm.gpus_per_node, problems)
    if problems:
        raise ConfigError(f"job {job.name!r} on {world_size} ranks", problems.items)
    return layout


def mark_ready(run, attempt: int) -> None:
    """Every rank has its signal handlers (installed before the rendezvous): from now on the
    batch shell may forward a signal to the step instead of only leaving the flag file."""
    folder = run.attempt_dir(attempt)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ready").touch()


def exit_without_collecting() -> None:
    """Freeze the garbage collector when the rank's interpreter exits (an ``atexit`` hook).

    A rank that imported torch and megatron-core spends about 0.7 CPU-s of its exit in the
    interpreter's final garbage collections, over objects the end of the process frees anyway.
    On a loaded node that CPU is tens of seconds of wall time after the attempt has ended, in
    which the batch shell waits for the step: long enough to reach Slurm's ``KillWait`` after
    a cancel (the batch shell is killed before it records the attempt). Frozen objects are
    skipped by those collections; every ``atexit`` hook, flush and module teardown still runs."""
    import atexit
    import gc
    atexit.register(gc.freeze)


def train_main(run_dir: str | None = None) -> dict:
    from ..identity import rank_env
    from ..record.attempt_records import AttemptResult
    from ..record.folder import RunFolder
    from .job_env import job_env
    from .log import logger, redirect_output, setup

    jenv = job_env()
    exit_without_collecting()
    run_dir = run_dir or jenv.run_dir
    if not run_dir:
        raise HpcTrainError("no run folder: pass RUN_DIR or set HPCTRAIN_RUN_DIR")
    run = RunFolder(Path(run_dir).resolve())
    renv = rank_env()
    attempt = attempt_number(run, jenv.attempt)
    if jenv.log_to_file:
        redirect_output(run.rank_log(attempt, renv.rank))
    setup(renv.rank)
    # what the attempt did, filled in as it goes: written as result.json however it ends
    result = AttemptResult(attempt=attempt, start_time=time.time())
    try:
        outcome, summary = _train(run, renv, jenv, result)
    except BaseException as e:  # noqa: BLE001 - record every way an attempt can end
        failed_at = time.time()
        _cleanup()
        if isinstance(e, SystemExit) and e.code in STOP_CODES:
            raise
        reason = ExitReason.FAILED
        message = f"{type(e).__name__}: {e}" if not isinstance(e, HpcTrainError) else str(e)
        if isinstance(e, KeyboardInterrupt):
            message = "interrupted twice (Ctrl-C): stopped without a checkpoint"
        _record_failure(run, result.attempt, renv, failed_at, message)
        logger.info(f"attempt {attempt} failed: {message}")
        if not isinstance(e, HpcTrainError):
            logger.info(traceback.format_exc())
        code = _finish(run, renv, jenv, result, reason, exit_codes.FAILED, message,
                       collective=False)
        if code == exit_codes.LOCAL_REQUEUE:
            raise SystemExit(code) from e
        raise
    code = _finish(run, renv, jenv, result, outcome.exit_reason, outcome.exit_code,
                   outcome.message, collective=True)
    _teardown()
    _cleanup(exiting=True)
    if code != exit_codes.FINISHED:
        raise SystemExit(code)
    return summary


def _train(run: RunFolder, renv: RankEnv, jenv: JobEnv,
           result: AttemptResult) -> tuple[Outcome, dict]:
    """One attempt of training on this rank, filling ``result`` in as it goes (what a
    failure midway leaves there is what result.json says)."""
    from .versions import import_megatron_core
    import_megatron_core()
    from ..record.attempt_end import in_job_restart_event
    from . import collectives, distributed
    from .assembly import assemble_attempt
    from .comm_overlap import describe as describe_overlap
    from .context import RankContext
    from .digest import weights_digest
    from .faults import TestHooks
    from .log import logger
    from .model import build_model_and_optimizer, initialize_parallel
    from .preemption import PreemptionFlag
    from .versions import check_megatron_core

    job, profile = run.resolved_job(), run.resolved_profile()
    layout = resolve_layout(job, profile, renv.world_size)
    from ..planner.layouts import with_optimizer_format
    job = with_optimizer_format(job, profile, layout)   # "auto" in a job.yaml not from submit
    connections_note = distributed.set_device_connections(layout)   # before CUDA starts
    from . import determinism
    determinism_notes = determinism.prepare_environment(job)         # before CUDA and NCCL
    check_megatron_core()
    hooks = TestHooks.from_env()
    device = distributed.choose_device(profile)
    # The layer implementation before any GPU time: without Transformer Engine the ranks stop
    # here with the import error and the fix (model.transformer_impl, hpctrain.runtime.layers).
    from . import layers
    result.layers = layers.choose(job, device).record()
    # Handlers before the slow part (imports, rendezvous): a signal during start-up is kept.
    flag = PreemptionFlag(jenv.preempt_signal or profile.preemption.signal,
                          jenv.signal_flag if renv.rank == 0 else None)
    flag.install()
    flag.watch_file()
    distributed.prepare_device(device, renv)
    distributed.init_process_group(renv, device, job.train.init_timeout_s)
    attempt = result.attempt = collectives.broadcast_object(result.attempt)
    hooks.attempt = attempt
    if renv.rank == 0:
        mark_ready(run, attempt)
    ctx = RankContext(run=run, job=job, profile=profile, layout=layout, env=renv, job_env=jenv,
                      attempt=attempt, device=device)
    ctx.watchdog = _start_watchdog(run, renv, jenv, job, device, attempt)
    if ctx.is_rank0:
        _log_start(ctx, hooks)
        if connections_note:
            logger.info(f"note: {connections_note}")
        for note in determinism_notes:
            logger.info(f"note: {note}")
    determinism.enable(job)
    initialize_parallel(layout, job.train.seed)
    mo = build_model_and_optimizer(job, layout, device)
    result.local_parameters = sum(p.numel() for m in mo.modules for p in m.parameters())
    from .checkpoint.optimizer_step import describe_optimizer
    result.optimizer = describe_optimizer(mo.optimizer)
    if ctx.is_rank0:
        _log_model(ctx, result.local_parameters)
        logger.info(f"optimizer: {result.optimizer}")
        logger.info(f"communication: {describe_overlap(mo.model, mo.config)}")
        for note in mo.notes:
            logger.info(f"note: {note}")
    def resumed(loaded) -> None:     # kept if the attempt fails later
        result.checkpoint_loaded = str(loaded.path)
        result.load_seconds = round(loaded.seconds, 3)
    parts = assemble_attempt(ctx, mo, hooks, flag, on_resumed=resumed)
    feeder, ckpt, loaded, metrics, trainer = (parts.feeder, parts.checkpointer, parts.loaded,
                                              parts.metrics, parts.trainer)
    result.start_step = result.end_step = trainer.step
    # kept if the attempt fails later: the recovery time after a failure counts to it
    def on_first_step(at: float) -> None:
        result.first_step_after_s = round(at - result.start_time, 3)
        if ctx.is_rank0:      # the trackers show an in-job restart as the attempt trains
            try:
                in_job_restart_event(run, attempt, round(at, 3), trainer.step)
            except Exception as e:  # noqa: BLE001 - the ledger still records it at the end
                logger.warning(f"could not record the in-job restart event: {e}")
    trainer.on_first_step = on_first_step
    ctx.watchdog.progress(step=trainer.step, phase="step")
    ctx.watchdog.start_step = trainer.step
    outcome = None
    try:
        outcome = trainer.run()
        flag.stand_down()
    finally:
        result.end_step = trainer.step
        result.last_loss = trainer.last_loss
        result.straggler = trainer.straggler
        finished = outcome is not None and outcome.exit_reason == ExitReason.FINISHED
        metrics.close(finished_step=trainer.step if finished else None,
                      status="finished" if finished else "failed" if outcome is None
                      or outcome.exit_reason == ExitReason.UNSTABLE else "stopped")
        feeder.close()
        logger.info(f"data: {feeder.microbatches_read} microbatches read by this rank "
                    f"({feeder.where})")
    ckpt.close()
    if mo.layers is not None:
        result.layers["attention_in_use"] = layers.attention_in_use(mo.layers)
    if device == "cuda":
        import torch
        result.peak_gpu_memory_bytes = torch.cuda.max_memory_allocated()
    result.checkpoint_saved = outcome.checkpoint_saved or ckpt.last_published_path
    result.saves = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()
                     if k in ("step", "reason", "seconds", "stall_seconds", "total_seconds",
                              "bytes", "sync", "write_seconds")} for s in ckpt.saves]
    result.host_staging = ckpt.arena.describe()
    result.host_staging_locked = ckpt.arena.lock_record()
    if loaded is not None:
        result.load_seconds = round(loaded.seconds, 3)
        result.verify_seconds = round(ckpt.verify_seconds or 0.0, 3)
        result.resume_read = ckpt.read_stats
    if trainer.first_step_started is not None:
        result.first_step_after_s = round(trainer.first_step_started - result.start_time, 3)
    result.weights_digest = weights_digest(mo.modules)
    summary = {"run": run.id, "attempt": attempt, "start_step": outcome.start_step,
               "end_step": outcome.end_step, "exit_reason": outcome.exit_reason,
               "last_loss": outcome.last_loss, "checkpoint_saved": result.checkpoint_saved,
               "weights_digest": result.weights_digest}
    return outcome, summary


def _log_model(ctx, local: int) -> None:
    from ..flops import forward_flops_per_token
    from ..model_shape import ModelShape, total_parameters
    from .log import logger
    tp = ctx.layout.tensor_model_parallel_size
    shape = ModelShape.from_model(ctx.job.model)
    logger.info(f"model: {total_parameters(shape, tp) / 1e6:.2f}M parameters ({local / 1e6:.2f}M "
                f"on rank 0), {3 * forward_flops_per_token(shape, tp) / 1e9:.3f} GFLOP per "
                f"trained token")


def _log_start(ctx, hooks) -> None:
    import torch
    from .log import logger
    lay = ctx.layout
    from .layers import choose
    how = ("CPU rehearsal: gloo, fp32, megatron-core's CUDA calls shimmed onto the CPU"
           if ctx.device == "cpu" else f"GPU: NCCL, {ctx.job.train.precision}")
    logger.info(f"run {ctx.run.id} attempt {ctx.attempt}: {ctx.world_size} ranks "
                f"({ctx.env.launcher}), {lay.describe()}, {lay.num_microbatches} microbatches "
                f"of {lay.micro_batch_size}; {how}; {choose(ctx.job, ctx.device).describe()}; "
                f"torch {torch.__version__}")
    from .. import fault_injection
    if hooks.active:
        logger.warning(f"warning: test hooks active ({fault_injection.SWITCH}=1): {hooks}")
    ignored = fault_injection.ignored()
    if ignored:
        logger.info(f"note: {', '.join(ignored)} set but ignored: test hooks need "
                    f"{fault_injection.SWITCH}=1")


def _finish(run: RunFolder, renv: RankEnv, jenv: JobEnv, result: AttemptResult,
            reason: ExitReason, code: int, message: str, collective: bool) -> int:
    """Rank 0 records the attempt; under the local executor the requeue decision is applied."""
    from ..record.attempt_end import finish_attempt, write_result
    from .log import logger

    requeue = False
    if renv.rank == 0:
        result.exit_reason, result.exit_code = reason, code
        result.end_time, result.message = time.time(), message
        try:
            write_result(run, result.attempt, result)
        except OSError as e:
            logger.info(f"could not write result.json: {e}")
        logger.info(f"attempt {result.attempt} ended: {reason} at step {result.end_step} "
                    f"({message})")
        if jenv.local_executor:
            _, decision = finish_attempt(run, result.attempt, code, scheduler="local",
                                         job_id=jenv.local_job_id)
            requeue = decision.requeue
            logger.info(f"{'requeue' if requeue else 'no requeue'}: {decision.reason}")
    if jenv.local_executor and collective:
        from . import collectives
        requeue = bool(collectives.broadcast_object(requeue))
    if requeue:
        return exit_codes.LOCAL_REQUEUE
    return code


def _record_failure(run, attempt: int, renv, at: float, message: str) -> None:
    """This rank's failure, for the end of the attempt to find the first one."""
    from ..record.attempt_end import write_failure
    from .log import logger
    try:
        write_failure(run, attempt, renv.rank, renv.node, at, message)
    except OSError as e:
        logger.info(f"could not record this rank's failure: {e}")


_WATCHDOG = []   # the rank's watchdog, stopped however the attempt ends


def _start_watchdog(run: RunFolder, renv: RankEnv, jenv: JobEnv, job: JobConfig, device: str,
                    attempt: int) -> Watchdog:
    """The hang watchdog (``runtime.watchdog``). Under the local executor no batch shell
    outlives the ranks: rank 0's watchdog records a hang itself (no requeue: there is no other
    node to move to)."""
    from .log import logger
    from .watchdog import Watchdog

    def record_locally(verdict) -> None:
        from ..record.attempt_end import finish_attempt, hang_details
        finish_attempt(run, attempt, exit_codes.HUNG, scheduler="local",
                       job_id=jenv.local_job_id, refuse_requeue="a hang under the local "
                       "executor: there is no other node to move to", **hang_details(verdict))

    on_verdict = record_locally if (renv.rank == 0 and jenv.local_executor) else None
    dog = Watchdog(run.attempt_dir(attempt), renv.rank, renv.node,
                   hang_timeout_s=job.health.hang_timeout_s, dump_stacks=job.health.dump_stacks,
                   device=device, init_timeout_s=job.train.init_timeout_s,
                   on_verdict=on_verdict, log=logger.info)
    _WATCHDOG.append(dog)
    return dog.start()


def _cleanup(exiting: bool = False) -> None:
    """Stop the watchdog (``exiting``: the attempt ended as every rank agreed; see
    ``Watchdog.stop``) and the checkpoint writer's results queue."""
    import sys
    while _WATCHDOG:
        _WATCHDOG.pop().stop(exiting=exiting)
    if "hpctrain.runtime.checkpoint.results_queue" in sys.modules:
        sys.modules["hpctrain.runtime.checkpoint.results_queue"].remove_results_queue()


def _teardown() -> None:
    from . import distributed
    distributed.destroy_process_group()
