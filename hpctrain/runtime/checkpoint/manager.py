"""Saving and resuming, across all ranks: the collective half of checkpointing.

Save (every rank calls it at the same step):
  rank 0 makes ``.partial-step-N-aK`` -> barrier -> every rank hands its shards to
  ``dist_checkpointing.save`` (replicated tensors spread over the DP ranks) -> each rank's
  writer checksums the files it wrote -> after all writers finished, rank 0 writes the
  manifest last, renames the folder to ``step-N`` and moves ``latest`` -> prune.
  Periodic saves run the write in a background process (megatron-core's async save): the
  training loop pays only for building the plan and forking; ``poll()`` at each step
  boundary publishes it once every rank's writer is done. Emergency and final saves are
  synchronous: the process is about to exit.

Resume: rank 0 first makes the folder this run's (``store.claim``: a folder holding another
run's checkpoints is refused, nothing in it touched), then walks ``step-N`` folders newest
first; a folder whose manifest is missing or whose files do not match it (sizes, then CRC32
spread over all ranks) is moved to ``quarantine/`` with a log line, and the next older one is
tried.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ... import __version__
from ...record import checkpoint_store as store
from ...record import reader as run_files
from ...errors import HpcTrainError
from ...record.checkpoint_store import CheckpointError
from .. import collectives, rng
from ..digest import stored_weights_digest
from ..log import logger
from . import cross_device
from . import reader
from . import staging
from .staging import staging_estimate
from . import state as ckstate
from . import writer
from .results_queue import install_results_queue
from .save_faults import save_fault, save_faults_in_one_line

SIDECAR = ".crc-rank{rank}.json"


@dataclass
class Loaded:
    step: int
    path: Path
    common: dict
    manifest: dict
    seconds: float
    same_layout: bool


def layers_record(mo) -> dict | None:
    """The model's layer implementation for manifests (runtime.layers.LayerImpl.record)."""
    impl = getattr(mo, "layers", None)
    return impl.record() if impl is not None else None


def versions() -> dict:
    import torch
    from ..versions import installed_megatron_core
    return {"hpctrain": __version__, "megatron_core": installed_megatron_core(),
            "torch": torch.__version__}


def _write(transform_list, folder: str, rank: int, main_pid: int, kill: bool, progress,
           delay: float, *args):
    """Runs where megatron's writer runs (a forked process for async saves, the rank itself
    for synchronous ones): write the staged buckets with their checksums
    (``writer.write_buckets``), ``progress()`` after each item."""
    if delay:   # HPCTRAIN_TEST_SLOW_WRITER_S: the next save comes while this one still reads
        time.sleep(delay)
    writer.write_buckets(transform_list, *args, folder=folder, sidecar=SIDECAR.format(rank=rank),
                         progress=progress)
    if kill:  # HPCTRAIN_TEST_KILL_DURING_SAVE: die with the shards written, unpublished
        os.kill(main_pid, signal.SIGKILL)
        os._exit(1)


def _count_item(counter, delay: float) -> None:
    """A background writer's progress, in its forked process: one more item written, in
    ``counter`` (shared memory the rank reads while it waits). Two writer threads may lose an
    increment between them; the count still moves, and only its moving is read.
    ``delay``: HPCTRAIN_TEST_SLOW_WRITER_ITEM_S (slow storage: each item takes this long)."""
    if delay:
        time.sleep(delay)
    counter.value += 1


def own_staging_and_writer(request, arena, owner: str, folder: str, rank: int, kill: bool,
                           progress=None, delay: float = 0.0, page_locked: bool = True):
    """megatron's save request with hpctrain's staging (the process's host arena, held until
    the writer finished) and writer (checksums of the bytes written) in place of its own.
    ``progress``: called after each item written (a synchronous save: the watchdog's).
    ``page_locked``: False for a synchronous save, which stages on the training thread anyway
    and must not wait for page-locking still in progress (an emergency save right after a
    resume)."""
    if request.async_fn is None:            # nothing for this rank to write
        return request
    transform_list = request.async_fn.args[0]      # partial(write_preloaded_data_multiproc, ..)
    buckets = request.async_fn_args[1]
    return request._replace(
        preload_fn=functools.partial(writer.stage, arena, owner, buckets, page_locked),
        async_fn=functools.partial(_write, transform_list, folder, rank, os.getpid(), kill,
                                   progress, delay))


def _data_record(common: dict) -> dict:
    """The data fingerprint for the manifest, where the CLI reads it without torch (a caller
    whose common state has none, e.g. a test of the save alone, records none)."""
    return {"data": common["data"]} if common.get("data") is not None else {}


def _load_strategy(folder: Path):
    """Fully parallel load (Megatron-LM's --ckpt-fully-parallel-load): the DP replicas of a
    shard each read a different part of it from storage and exchange the rest, instead of
    every replica reading the whole shard."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import \
        FullyParallelLoadStrategyWrapper
    return FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(str(folder)),
                                            ps.get_data_parallel_group(with_context_parallel=True))


class CheckpointDamaged(CheckpointError):
    """A checkpoint failed a check made while loading it (set aside; the previous one is tried)."""


def _checksum_failures(error: BaseException) -> list[str]:
    """The item checksum failures inside torch's CheckpointException (every rank's)."""
    failures = getattr(error, "failures", None) or {}
    out = []
    for rank, wrapped in sorted(failures.items()):
        exc = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        if isinstance(exc, reader.ChecksumMismatch):
            out.append(f"rank {rank}: {exc}")
    if isinstance(error, reader.ChecksumMismatch):
        out.append(str(error))
    return out


def _read_stats(readers, seconds: float) -> dict:
    """The load's reads on this rank: sums over its readers (megatron makes one per load), the
    most threads and the largest streaming ring (page-locked on CUDA) any of them used."""
    stats = {"bytes": 0, "items": 0, "verified": 0, "zero_copy": 0, "streamed": 0,
             "threads": 0, "ring_bytes": 0, "seconds": round(seconds, 3)}
    for r in readers:
        for k in ("bytes", "items", "verified", "zero_copy", "streamed"):
            stats[k] += r.stats[k]
        stats["threads"] = max(stats["threads"], r.threads)
        stats["ring_bytes"] = max(stats["ring_bytes"], r.stats["ring_bytes"])
    stats["gb_per_s"] = stats["bytes"] / 1e9 / seconds if seconds > 0 else 0.0
    return stats


class Checkpointer:
    # how often a rank waiting for its background writer looks at the writer's item count
    WRITER_PROGRESS_POLL_S = 1.0

    def __init__(self, ctx, mo, root: Path, hooks) -> None:
        self.ctx = ctx
        self.mo = mo
        self.root = Path(root)
        self.hooks = hooks
        self._queue = None
        self._strategy = None
        self._validated = False
        self.pending: list[dict] = []       # async saves not yet published
        self.last_published_step: int | None = None
        self.last_published_path: str | None = None
        self.estimate = None                # a preemption.SaveEstimate, fed with every save
        self.saves: list[dict] = []         # timings of every save this attempt
        self.on_published = None            # rank 0: called with each published step
        self.verify_seconds: float | None = None
        # host memory of every save and load
        self.arena = staging.process_arena(ctx.device, hooks.cpu_page_lock())
        self.arena.reserve(staging_estimate(mo, ctx.layout))
        self.read_stats: dict = {}
        # items the background writers wrote (shared with the forked writer processes), and
        # the watcher that reports them while a rank waits (:meth:`_writer_progress`)
        self._items_written = multiprocessing.RawValue("Q", 0)
        self._writer_watch_lock = threading.Lock()
        self._writer_watch_done: threading.Event | None = None

    # ------------------------------------------------------------------ saving
    def _save_strategy(self):
        if self._strategy is None:
            from megatron.core import parallel_state as ps
            from megatron.core.dist_checkpointing.serialization import \
                get_default_save_sharded_strategy
            from megatron.core.dist_checkpointing.strategies.fully_parallel import \
                FullyParallelSaveStrategyWrapper
            base = get_default_save_sharded_strategy()
            # the state's structure is the same at every save of a process: plan once, reuse
            # (Megatron-LM's --ckpt-assume-constant-structure; megatron-core validates the
            # cached plan against a fresh one at the second save and reuses it from the third)
            base.use_cached_ckpt_structure = True
            group = ps.get_data_parallel_group(with_context_parallel=True)
            self._strategy = FullyParallelSaveStrategyWrapper(base, group, do_cache_distribution=True)
        return self._strategy

    def _async_queue(self):
        if self._queue is None:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue
            self._queue = AsyncCallsQueue(persistent=False)
        return self._queue

    def _storage_faults(self, step: int | None):
        """A save that fails on the storage (no space, quota, permission, read-only or vanished
        file system) or loses a peer inside its collectives ends the attempt with one line
        (:func:`.save_faults.save_faults_in_one_line`, the one door) naming the path, the fault
        and the newest complete checkpoint, which stays intact; the traceback goes to this
        rank's log only (``submit --wait`` does not show it)."""
        if step is None and self.pending:
            step = self.pending[0]["step"]
        return save_faults_in_one_line(step=step, path=self.root, newest=self._newest_complete,
                                       run_id=self.ctx.run.id, log=logger.info)

    def _newest_complete(self) -> str | None:
        newest = self.last_published_path or store.read_latest(self.root)
        if newest and not os.path.isabs(newest):
            newest = str(self.root / newest)
        return newest

    def save(self, step: int, common: dict, reason: str, sync: bool) -> dict:
        """Save at ``step`` (collective). Returns timings; sync saves are published on return."""
        self.hooks.limit_file_size(step)
        with self._storage_faults(step):
            return self._save(step, common, reason, sync)

    def _save(self, step: int, common: dict, reason: str, sync: bool) -> dict:
        from megatron.core import dist_checkpointing

        if any(p["step"] == step for p in self.pending) or self.last_published_step == step:
            if sync:
                self.wait()
            return {"step": step, "skipped": "already saved", "path": self.last_published_path}
        if self.pending:
            self.wait()  # one background save at a time
        started = time.monotonic()
        self.ctx.progress(f"save: step {step} ({reason})")
        install_results_queue()
        partial = store.partial_dir(self.root, step, self.ctx.attempt)
        error = None
        if self.ctx.is_rank0:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                if partial.exists():
                    store.quarantine(self.root, partial, "left by an earlier save of the same "
                                                         "step")
                partial.mkdir()
            except OSError as e:
                error = e
        # every rank hears rank 0's fault (else the others would wait for it forever)
        error = collectives.broadcast_object(error)
        if error is not None:
            raise error
        digest = stored_weights_digest(self.mo.modules)   # what this save must give back
        sd = ckstate.full_sharded_state(self.mo, common, rng.capture(self.ctx.device),
                                        self.ctx.job.checkpoint.optimizer_format)
        request = dist_checkpointing.save(
            sd, str(partial), sharded_strategy=self._save_strategy(), async_sharded_save=True,
            validate_access_integrity=not self._validated)
        self._validated = True
        del sd
        kill = self.hooks.kill_during_save(self.ctx.rank, step)
        owner = f"the save of step {step}"
        self.arena.release()          # every earlier writer has finished (waited above)
        # a synchronous save writes on this rank: each item written is progress for the hang
        # watchdog (a long emergency save on a busy file system is not a hang)
        writing = f"save: writing step {step} ({reason})"
        progress = functools.partial(self.ctx.progress, writing) if sync else \
            functools.partial(_count_item, self._items_written, self.hooks.writer_item_delay())
        request = own_staging_and_writer(request, self.arena, owner, str(partial),
                                         self.ctx.rank, kill, progress,
                                         self.hooks.writer_delay(sync), page_locked=not sync)
        info = {"step": step, "reason": reason, "partial": partial, "started": started,
                "sync": sync, "wall_started": time.time(), "digest": digest}
        request.add_finalize_fn(functools.partial(self.arena.release, owner))
        request.add_finalize_fn(functools.partial(self._publish, info, common))
        if sync:
            request.execute_sync()
            info["seconds"] = time.monotonic() - started
            info["stall_seconds"] = info["seconds"]
        else:
            self._async_queue().schedule_async_request(request)
            info["stall_seconds"] = time.monotonic() - started
            self.pending.append(info)
            self.hooks.fill_after_staging(self.arena, logger.info)
        self.saves.append(info)
        return info

    def pending_left_s(self, expected_s: float) -> float:
        """How long the background save in flight may still take, for a save that takes
        ``expected_s`` in all: any save waits for it first (0 when none is in flight)."""
        if not self.pending:
            return 0.0
        return max(0.0, expected_s - (time.monotonic() - self.pending[-1]["started"]))

    def step_done(self, step: int) -> None:
        """After each training step: the first one starts page-locking the staging memory
        (:meth:`.staging.HostArena.lock_pages`, which starts once: not during the resume or
        the first step)."""
        self.arena.lock_pages(after_step=step)

    def poll(self) -> None:
        """Publish background saves that every rank finished (collective, non-blocking)."""
        if self._queue is not None and self.pending:
            with self._storage_faults(None):
                self._queue.maybe_finalize_async_calls(blocking=False)

    def wait(self) -> None:
        """Finish and publish every background save (collective, blocking)."""
        if self._queue is not None and self.pending:
            with self._storage_faults(None), self._writer_progress():
                self._queue.maybe_finalize_async_calls(blocking=True)

    @contextlib.contextmanager
    def _writer_progress(self):
        """While this rank waits for its background writer, each look that finds more items
        written is progress for the hang watchdog: a long background write on a busy file
        system is not a hang, whether the wait is a save waiting for the one before it, an
        emergency save, or the end of training. A writer that writes nothing for the hang
        limit still is one."""
        info = self.pending[-1]
        phase = f"save: writing step {info['step']} ({info['reason']}) in the background"
        done = self._writer_watch_done = threading.Event()

        def watch() -> None:
            seen = self._items_written.value
            while not done.wait(self.WRITER_PROGRESS_POLL_S):
                with self._writer_watch_lock:     # never after the publish has begun
                    if not done.is_set() and self._items_written.value != seen:
                        seen = self._items_written.value
                        self.ctx.progress(phase)

        watcher = threading.Thread(target=watch, name="hpctrain-writer-progress", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            self._end_writer_watch()
            watcher.join()

    def _end_writer_watch(self) -> None:
        """The writer is done (its finalize has begun, or the wait ended): the watcher says
        nothing more, so a publish's own phases are the last heard."""
        with self._writer_watch_lock:
            if self._writer_watch_done is not None:
                self._writer_watch_done.set()

    def close(self) -> None:
        self.wait()
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    def _publish(self, info: dict, common: dict) -> None:
        """Finalize step (all ranks, after every writer finished): manifest last, then rename."""
        step, partial = info["step"], info["partial"]
        self._end_writer_watch()
        self.ctx.progress(f"save: publishing step {step}")

        def on_rank0() -> str:
            try:
                files: dict[str, dict] = {}
                write_seconds = []
                for sidecar in sorted(partial.glob(".crc-rank*.json")):
                    record = run_files.read_json(sidecar) or {}
                    files.update(record["files"])
                    write_seconds.append(record.get("write_seconds", 0.0))
                    sidecar.unlink()
                info["write_seconds"] = max(write_seconds, default=None)
                # the small files rank 0 wrote itself (metadata, common state), synced: the
                # manifest published next vouches for them
                rest = [n for n in store.list_files(partial) if n not in files]
                files.update(store.checksum_files(partial, rest, writer.CHECKSUM, durable=True))
                manifest = store.build_manifest(
                    step, files, kind="full", reason=info["reason"],
                    consumed_samples=common["consumed_samples"],
                    layout=self.ctx.layout_record(), versions=versions(),
                    optimizer_format=self.ctx.job.checkpoint.optimizer_format,
                    device=self.ctx.device, layers=layers_record(self.mo),
                    run=self.ctx.run.id, attempt=self.ctx.attempt, job=self.ctx.job.name,
                    save_seconds=round(time.monotonic() - info["started"], 3),
                    background=not info["sync"], checksum=writer.CHECKSUM,
                    weights_digest=info["digest"], **_data_record(common))
                final = store.publish(partial, self.root, step, manifest)
                info["bytes"] = manifest["total_bytes"]
                return str(final)
            except OSError as e:
                error = f"publishing checkpoint step {step} failed: {e}"
                fault = save_fault(e, step=step, path=partial, newest=self.last_published_path
                                   or store.read_latest(self.root), run_id=self.ctx.run.id)
                if fault:
                    raise fault from e
                raise CheckpointError(error) from e
        # every rank hears how it went (a damaged sidecar too), or the others wait forever
        info["path"] = collectives.on_rank0(on_rank0, self.ctx.is_rank0)
        info["total_seconds"] = time.monotonic() - info["started"]
        self.last_published_path = info["path"]
        if self.estimate is not None:
            self.estimate.record(info["total_seconds"])
        if info in self.pending:
            self.pending.remove(info)
        self.last_published_step = step
        if self.ctx.is_rank0:
            kind = "background " if not info["sync"] else ""
            # the time the event and result.json keep (rounded once): printed from the
            # unrounded one, the line could differ from them in its last digit
            logger.info(f"checkpoint: saved step {step} ({info['reason']}, {kind}"
                        f"{info.get('bytes', 0) / 1e6:.1f} MB in "
                        f"{round(info['total_seconds'], 3):.2f}s) -> {info.get('path')}")
            self._after_publish(step, info)
        collectives.barrier()

    def _after_publish(self, step: int, info: dict) -> None:
        """Rank 0's bookkeeping once a checkpoint is published: the event, pruning, the
        metrics' commit. The checkpoint is safe whatever happens here, so a failure (a full
        run folder, a file pruning could not remove) is logged, not raised: raised on rank 0
        alone it would leave the others in the barrier, and fail an attempt whose save
        succeeded."""
        for what, work in (
                ("record the save", lambda: self.ctx.run.event(
                    "checkpoint_saved", step=step, reason=info["reason"], path=info.get("path"),
                    seconds=round(info["total_seconds"], 3), attempt=self.ctx.attempt)),
                ("prune old checkpoints", lambda: store.prune(
                    self.root, self.ctx.job.checkpoint.keep_last, logger.info,
                    run_id=self.ctx.run.id)),
                ("commit the metrics", lambda: self.on_published and self.on_published(step))):
            try:
                work()
            except Exception as e:  # noqa: BLE001 - see above
                logger.info(f"checkpoint: saved step {step}, but could not {what}: "
                            f"{type(e).__name__}: {e}")

    # ------------------------------------------------------------------ resuming
    def claim(self) -> None:
        """Rank 0: make the checkpoint folder this run's before touching anything in it; refuse
        (ForeignCheckpointsError) when it holds another run's checkpoints."""
        from ...record.folder import folder_mode
        store.claim(self.root, self.ctx.run.id, self.ctx.run.path,
                    folder_mode(self.ctx.profile.storage.group_readable))

    def _verify(self, folder: Path) -> tuple[dict | None, list[str]]:
        """Collective: cheap checks on rank 0 (the manifest, every file at its size). A
        checkpoint whose writer recorded each item's CRC32C has its shards verified while it
        loads, in the same read (``reader``), and only the small files that read never sees
        checked here; an older one (a CRC of each file only) is read through once here. The
        files checked here are shared out over the ranks."""
        checked = None
        if self.ctx.is_rank0:
            manifest = store.read_manifest(folder)
            checked = (manifest, store.manifest_problems(folder, manifest))
        manifest, problems = collectives.broadcast_object(checked)
        if problems:
            return manifest, problems
        in_read = bool(reader.manifest_items(manifest)) and self.hooks.read_threads != 0
        names = reader.files_read_unverified(manifest) if in_read else sorted(manifest["files"])
        mine = store.checksum_problems(folder, manifest,
                                       store.share(names, self.ctx.rank, self.ctx.world_size))
        problems = [p for ps in collectives.gather_objects(mine) for p in ps]
        return manifest, problems

    def _candidates(self) -> list[Path]:
        """Rank 0 claims the folder and sets incomplete saves aside; every rank gets the
        ``step-N`` folders, newest first (or rank 0's error: every rank must hear it, or the
        others wait forever)."""
        def on_rank0() -> list[str]:
            try:
                self.claim()
            except store.ForeignCheckpointsError as e:
                raise CheckpointError(str(e)) from None
            except (OSError, HpcTrainError) as e:   # the claim words what it could not write
                raise CheckpointError(f"cannot use checkpoint folder {self.root}: {e}") from None
            for partial in store.partial_checkpoints(self.root):
                where = store.quarantine(self.root, partial, "incomplete: the save never finished "
                                                             "(the job was killed while writing)")
                logger.info(f"checkpoint: moved incomplete {partial.name} to {where}")
                self.ctx.run.event("checkpoint_quarantined", path=str(where), reason="incomplete")
            return [str(d) for _, d in store.complete_checkpoints(self.root)]
        return list(map(Path, collectives.on_rank0(on_rank0, self.ctx.is_rank0) or []))

    def _set_aside(self, folder: Path, problems: list[str]) -> None:
        def on_rank0() -> None:
            reason = "; ".join(problems[:5])
            where = store.quarantine(self.root, folder, f"failed verification: {reason}")
            logger.info(f"checkpoint: {folder.name} is damaged ({reason}); moved it to "
                        f"{where} and trying the previous one")
            self.ctx.run.event("checkpoint_quarantined", path=str(where), reason=reason)
        collectives.on_rank0(on_rank0, self.ctx.is_rank0)

    def find_resumable(self) -> tuple[Path, dict] | None:
        """The newest checkpoint that passes the checks made before loading; everything broken
        on the way is quarantined."""
        for folder in self._candidates():
            manifest, problems = self._verify(folder)
            if not problems:
                return folder, manifest
            self._set_aside(folder, problems)
        return None

    def resume(self) -> Loaded | None:
        """Load the newest good checkpoint. One that fails its checks while loading (an item's
        CRC32C, the weights' digest) is quarantined and the previous one loaded over it; when
        none is left after such a failure the attempt stops rather than train from a model
        that a damaged checkpoint half overwrote (the next attempt starts fresh)."""
        started = time.monotonic()
        self.ctx.progress("load: verifying checkpoints")
        self.verify_seconds = 0.0
        overwritten = None
        for folder in self._candidates():
            checked = time.monotonic()
            manifest, problems = self._verify(folder)
            self.verify_seconds += time.monotonic() - checked
            if not problems:
                try:
                    return self.load(folder, manifest)
                except CheckpointDamaged as e:
                    problems, overwritten = [str(e)], folder.name
            self._set_aside(folder, problems)
        if overwritten is not None:
            raise CheckpointError(f"checkpoint {overwritten} failed verification while loading "
                                  f"and no older checkpoint is left; the damaged ones are in "
                                  f"{self.root / store.QUARANTINE}; the next attempt starts "
                                  f"from the initial weights")
        logger.debug(f"no checkpoint to resume ({time.monotonic() - started:.2f}s)")
        return None

    def check_data_position(self, folder: Path, manifest: dict) -> None:
        """Refuse a checkpoint whose data position the job's data settings would give another
        meaning (:func:`hpctrain.data.fingerprint.resume_problem`, the check ``hpctrain resume``
        makes too): a CheckpointError on every rank, before anything is read, unless the run's
        events accept the change for this checkpoint (``resume --accept-data-change``).
        Rank 0 alone reads the corpora's headers and decides (one verdict: ranks deciding
        apart on a file one of them cannot read would split at the next collective). A
        checkpoint saved before fingerprints were recorded has none and loads."""
        from ...data import fingerprint as fp

        def verdict() -> tuple[str | None, list[str]]:
            saved, run = manifest.get("data"), self.ctx.run
            notes = [n for n in [fp.evaluation_note(saved, self.ctx.job, folder.name)] if n]
            problem = fp.resume_problem(saved, self.ctx.job, folder.name,
                                        manifest.get("consumed_samples"), run.id)
            if problem and fp.change_accepted(run.events(), folder.name):
                notes.append(f"{problem.split('; ')[0]}; accepted by `hpctrain resume "
                             f"{fp.ACCEPT_OPTION}`")
                problem = None
            return problem, notes
        problem, notes = collectives.on_rank0(verdict, self.ctx.is_rank0)
        if problem:
            raise CheckpointError(problem)
        for note in notes if self.ctx.is_rank0 else ():
            logger.info(f"note: {note}")

    def load(self, folder: Path, manifest: dict) -> Loaded:
        from megatron.core import dist_checkpointing
        self.ctx.progress(f"load: {folder.name}")

        started = time.monotonic()
        saved = manifest.get("layout", {})
        want_distopt = bool(self.ctx.job.parallel.use_distributed_optimizer)
        if manifest.get("kind", "full") != "full":
            raise CheckpointError(f"{folder} holds model weights only; use it as train.init_from")
        if bool(saved.get("distributed_optimizer")) != want_distopt:
            raise CheckpointError(
                f"checkpoint {folder} was saved with parallel.use_distributed_optimizer="
                f"{str(bool(saved.get('distributed_optimizer'))).lower()}; resume with the same "
                f"setting (any TP/PP/VPP/DP works), or start from its weights only with "
                f"train.init_from")
        here = self.ctx.layout_record()
        same_layout = all(saved.get(k) == here[k] for k in ("tp", "pp", "vpp", "dp"))
        fmt = manifest.get("optimizer_format", "fully_reshardable")
        if want_distopt and fmt == "dp_reshardable" and \
                any(saved.get(k) != here[k] for k in ("tp", "pp", "vpp")):
            raise CheckpointError(
                f"checkpoint {folder} stores the distributed optimizer as dp_reshardable, which "
                f"resumes only on the same TP×PP×VPP (saved {saved.get('describe')}, now "
                f"{here['describe']}; the DP size may change); resume on the saved TP/PP/VPP, "
                f"or save with checkpoint.optimizer_format: fully_reshardable")
        self.check_data_position(folder, manifest)
        impl = (layers_record(self.mo) or {}).get("transformer_impl", "local")
        cross_device.check_resume(folder, manifest, impl, want_distopt, fmt)
        phases = {"checks_s": time.monotonic() - started}   # where a resume's time goes
        mark = time.monotonic()
        template = ckstate.loading_template(self.mo, with_rng=same_layout, fmt=fmt)
        template["hpctrain"] = None
        kept = cross_device.set_aside_absent_entries(template, folder, "checkpoint")
        phases["template_s"] = time.monotonic() - mark
        arena_wait = self.arena.wait_ready()    # (page-locking starts after the first step)
        read_started = time.monotonic()
        try:
            with reader.installed(folder, manifest, self.arena, self.hooks.read_threads) \
                    as readers:
                loaded = dist_checkpointing.load(template, str(folder), _load_strategy(folder))
        except BaseException as e:   # torch's CheckpointException is a BaseException: it
            # reports every rank's failure on all ranks; anything else goes on up
            damaged = _checksum_failures(e)
            if damaged:
                raise CheckpointDamaged("; ".join(damaged[:3])) from e
            raise
        self.read_stats = _read_stats(readers, time.monotonic() - read_started)
        self.read_stats["host_memory_wait_s"] = round(arena_wait, 3)
        phases["read_s"] = time.monotonic() - read_started
        common = loaded["hpctrain"]
        cross_device.put_back(loaded, kept)
        restore_rng, why_not = self._apply(loaded, manifest, phases, same_layout=same_layout,
                                           impl=impl, want_distopt=want_distopt)
        self.read_stats["phases_s"] = {k: round(v, 3) for k, v in phases.items()}
        seconds = time.monotonic() - started
        self.last_published_step = int(common["step"])
        if self.ctx.is_rank0:
            note = "" if same_layout else (f"; layout changed from {saved.get('describe')} to "
                                           f"{here['describe']}: weights and optimizer resharded, "
                                           f"RNG streams restart from the seed")
            if same_layout and not restore_rng:
                note += f"; RNG streams restart from the seed ({why_not})"
            if cross_device.saved_impl(manifest) != impl:
                note += (f"; saved with {cross_device.saved_impl(manifest)} layers on "
                         f"{cross_device.saved_device(manifest)}, loaded into {impl}")
            if kept:
                note += f"; {cross_device.describe_kept(kept)}"
            stats = self.read_stats
            read = (f"; read {stats['bytes'] / 1e6:.1f} MB on rank 0 by {stats['threads']} "
                    f"threads at {stats['gb_per_s']:.2f} GB/s, {stats['verified']} of "
                    f"{stats['items']} items verified by CRC32C in the same pass, "
                    f"{stats['streamed']} streamed"
                    + (", weights equal to the digest taken at the save"
                       if stats.get("digest_checked") else "")) if stats.get("items") else ""
            # the time result.json keeps (load_seconds, rounded once), as the save's line
            logger.info(f"checkpoint: resumed from {folder} (step {common['step']}, "
                        f"{manifest.get('total_bytes', 0) / 1e6:.1f} MB in "
                        f"{round(seconds, 3):.2f}s){read}{note}")
        return Loaded(step=int(common["step"]), path=folder, common=common, manifest=manifest,
                      seconds=seconds, same_layout=same_layout)

    def _apply(self, loaded: dict, manifest: dict, phases: dict, *, same_layout: bool,
               impl: str, want_distopt: bool) -> tuple[bool, str]:
        """Put the loaded state into the model and the optimizer, check the weights against
        the save's digest, and only then restore the RNG streams; returns whether they were
        restored, and why not. A checkpoint that fails the digest is set aside with its weights
        and optimizer state applied, and the previous checkpoint's load overwrites all of
        them; but the RNG streams are restored only on the layout they were saved on, so a
        previous checkpoint saved on another layout would leave the damaged one's streams in
        place of the seed's. Restored last, they are never the damaged checkpoint's."""
        import torch
        mark = time.monotonic()
        ckstate.load_model_state(self.mo.model, loaded)
        ckstate.load_optimizer_state(self.mo.optimizer, loaded["optimizer"],
                                     int(loaded["hpctrain"]["optimizer_updates"]))
        restore_rng, why_not = cross_device.restore_rng_here(
            manifest, loaded.get("rng"), self.ctx.device, same_layout)
        rng_state = loaded.get("rng") if restore_rng else None
        loaded.clear()              # the loaded tensors go (the model holds its own copies)
        if self.ctx.device == "cuda":
            torch.cuda.synchronize()
        phases["apply_s"] = time.monotonic() - mark   # into the model and the optimizer
        mark = time.monotonic()
        self._check_digest(manifest, same_layout=same_layout, impl=impl,
                           want_distopt=want_distopt)
        phases["digest_s"] = time.monotonic() - mark
        if restore_rng:
            rng.restore(rng_state, self.ctx.device)
        return restore_rng, why_not

    def _check_digest(self, manifest: dict, *, same_layout: bool, impl: str,
                      want_distopt: bool) -> None:
        """The weights loaded against the digest taken at the save (where it compares like
        with like); a difference is damage found while loading (CheckpointDamaged)."""
        saved_digest = manifest.get("weights_digest")
        # one stored copy per replicated weight: data-parallel replicas are equal by
        # construction only with the distributed optimizer (it all-gathers one update)
        one_copy = want_distopt or self.ctx.layout.data_parallel_size == 1
        if saved_digest and same_layout and one_copy and cross_device.saved_impl(manifest) == impl:
            digest = stored_weights_digest(self.mo.modules)
            if digest != saved_digest:
                raise CheckpointDamaged(f"the weights loaded (digest {digest[:12]}) are not the "
                                        f"weights saved (digest {saved_digest[:12]})")
            self.read_stats["digest_checked"] = True
