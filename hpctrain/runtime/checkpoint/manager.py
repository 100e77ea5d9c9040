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

import functools
import glob
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ... import __version__
from ...record import checkpoint_store as store
from ...record.checkpoint_store import CheckpointError
from .. import collectives, rng
from ..log import logger
from . import cross_device
from . import state as ckstate
from .results_queue import install_results_queue

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


def _write_then_checksum(write_fn, folder: str, rank: int, main_pid: int, kill: bool,
                         *args, **kwargs):
    """Runs where megatron's writer runs (a forked process for async saves): write, then
    checksum this rank's files into a sidecar the publisher merges into the manifest."""
    if write_fn is not None:
        write_fn(*args, **kwargs)
    if kill:  # HPCTRAIN_TEST_KILL_DURING_SAVE: die with the shards written, unpublished
        os.kill(main_pid, signal.SIGKILL)
        os._exit(1)
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, f"__{rank}_*")))
    sums = store.checksum_files(Path(folder), names)
    store.write_json_atomic(Path(folder) / SIDECAR.format(rank=rank), sums)


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


class Checkpointer:
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

    # ------------------------------------------------------------------ saving
    def _save_strategy(self):
        if self._strategy is None:
            from megatron.core import parallel_state as ps
            from megatron.core.dist_checkpointing.serialization import \
                get_default_save_sharded_strategy
            from megatron.core.dist_checkpointing.strategies.fully_parallel import \
                FullyParallelSaveStrategyWrapper
            base = get_default_save_sharded_strategy()
            group = ps.get_data_parallel_group(with_context_parallel=True)
            self._strategy = FullyParallelSaveStrategyWrapper(base, group, do_cache_distribution=True)
        return self._strategy

    def _async_queue(self):
        if self._queue is None:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue
            self._queue = AsyncCallsQueue(persistent=False)
        return self._queue

    def save(self, step: int, common: dict, reason: str, sync: bool) -> dict:
        """Save at ``step`` (collective). Returns timings; sync saves are published on return."""
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
        if self.ctx.is_rank0:
            self.root.mkdir(parents=True, exist_ok=True)
            if partial.exists():
                store.quarantine(self.root, partial, "left by an earlier save of the same step")
            partial.mkdir()
        collectives.barrier()
        sd = ckstate.full_sharded_state(self.mo, common, rng.capture(self.ctx.device),
                                        self.ctx.job.checkpoint.optimizer_format)
        request = dist_checkpointing.save(
            sd, str(partial), sharded_strategy=self._save_strategy(), async_sharded_save=True,
            validate_access_integrity=not self._validated)
        self._validated = True
        kill = self.hooks.kill_during_save(self.ctx.rank, step)
        request = request._replace(async_fn=functools.partial(
            _write_then_checksum, request.async_fn, str(partial), self.ctx.rank, os.getpid(), kill))
        info = {"step": step, "reason": reason, "partial": partial, "started": started,
                "sync": sync, "wall_started": time.time()}
        request.add_finalize_fn(functools.partial(self._publish, info, common))
        if sync:
            request.execute_sync()
            info["seconds"] = time.monotonic() - started
            info["stall_seconds"] = info["seconds"]
        else:
            self._async_queue().schedule_async_request(request)
            info["stall_seconds"] = time.monotonic() - started
            self.pending.append(info)
        self.saves.append(info)
        return info

    def poll(self) -> None:
        """Publish background saves that every rank finished (collective, non-blocking)."""
        if self._queue is not None and self.pending:
            self._queue.maybe_finalize_async_calls(blocking=False)

    def wait(self) -> None:
        """Finish and publish every background save (collective, blocking)."""
        if self._queue is not None and self.pending:
            self._queue.maybe_finalize_async_calls(blocking=True)

    def close(self) -> None:
        self.wait()
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    def _publish(self, info: dict, common: dict) -> None:
        """Finalize step (all ranks, after every writer finished): manifest last, then rename."""
        step, partial = info["step"], info["partial"]
        self.ctx.progress(f"save: publishing step {step}")
        error = None
        if self.ctx.is_rank0:
            try:
                files: dict[str, dict] = {}
                for sidecar in sorted(partial.glob(".crc-rank*.json")):
                    import json
                    files.update(json.loads(sidecar.read_text()))
                    sidecar.unlink()
                rest = [n for n in store.list_files(partial) if n not in files]
                files.update(store.checksum_files(partial, rest))
                manifest = store.build_manifest(
                    step, files, kind="full", reason=info["reason"],
                    consumed_samples=common["consumed_samples"],
                    layout=self.ctx.layout_record(), versions=versions(),
                    optimizer_format=self.ctx.job.checkpoint.optimizer_format,
                    device=self.ctx.device, layers=layers_record(self.mo),
                    run=self.ctx.run.id, attempt=self.ctx.attempt, job=self.ctx.job.name,
                    save_seconds=round(time.monotonic() - info["started"], 3),
                    background=not info["sync"])
                final = store.publish(partial, self.root, step, manifest)
                info["bytes"] = manifest["total_bytes"]
                info["path"] = str(final)
            except OSError as e:
                error = f"publishing checkpoint step {step} failed: {e}"
        error, info["path"] = collectives.broadcast_object((error, info.get("path")))
        if error:
            raise CheckpointError(error)
        info["total_seconds"] = time.monotonic() - info["started"]
        self.last_published_path = info["path"]
        if self.estimate is not None:
            self.estimate.record(info["total_seconds"])
        if info in self.pending:
            self.pending.remove(info)
        self.last_published_step = step
        if self.ctx.is_rank0:
            kind = "background " if not info["sync"] else ""
            logger.info(f"checkpoint: saved step {step} ({info['reason']}, {kind}"
                        f"{info.get('bytes', 0) / 1e6:.1f} MB in {info['total_seconds']:.2f}s) "
                        f"-> {info.get('path')}")
            self.ctx.run.event("checkpoint_saved", step=step, reason=info["reason"],
                               path=info.get("path"), seconds=round(info["total_seconds"], 3),
                               attempt=self.ctx.attempt)
            store.prune(self.root, self.ctx.job.checkpoint.keep_last, logger.info,
                        run_id=self.ctx.run.id)
            if self.on_published is not None:
                self.on_published(step)
        collectives.barrier()

    # ------------------------------------------------------------------ resuming
    def claim(self) -> None:
        """Rank 0: make the checkpoint folder this run's before touching anything in it; refuse
        (ForeignCheckpointsError) when it holds another run's checkpoints."""
        from ...record.folder import folder_mode
        store.claim(self.root, self.ctx.run.id, self.ctx.run.path,
                    folder_mode(self.ctx.profile.storage.group_readable))

    def _verify(self, folder: Path) -> tuple[dict | None, list[str]]:
        """Collective: cheap checks on rank 0, then CRC32 of a share of the files on each rank."""
        checked = None
        if self.ctx.is_rank0:
            manifest = store.read_manifest(folder)
            checked = (manifest, store.manifest_problems(folder, manifest))
        manifest, problems = collectives.broadcast_object(checked)
        if problems:
            return manifest, problems
        names = sorted(manifest["files"])
        mine = store.checksum_problems(folder, manifest,
                                       store.share(names, self.ctx.rank, self.ctx.world_size))
        problems = [p for ps in collectives.gather_objects(mine) for p in ps]
        return manifest, problems

    def find_resumable(self) -> tuple[Path, dict] | None:
        """The newest checkpoint that verifies; everything broken on the way is quarantined."""
        candidates = None
        refused = None
        if self.ctx.is_rank0:
            try:
                self.claim()
            except store.ForeignCheckpointsError as e:
                refused = str(e)
            except OSError as e:   # every rank must hear it, or the others wait forever
                refused = f"cannot use checkpoint folder {self.root}: {e}"
        refused = collectives.broadcast_object(refused)
        if refused:
            raise CheckpointError(refused)
        if self.ctx.is_rank0:
            for partial in store.partial_checkpoints(self.root):
                where = store.quarantine(self.root, partial, "incomplete: the save never finished "
                                                             "(the job was killed while writing)")
                logger.info(f"checkpoint: moved incomplete {partial.name} to {where}")
                self.ctx.run.event("checkpoint_quarantined", path=str(where), reason="incomplete")
            candidates = [str(d) for _, d in store.complete_checkpoints(self.root)]
        for folder in map(Path, collectives.broadcast_object(candidates) or []):
            manifest, problems = self._verify(folder)
            if not problems:
                return folder, manifest
            if self.ctx.is_rank0:
                reason = "; ".join(problems[:5])
                where = store.quarantine(self.root, folder, f"failed verification: {reason}")
                logger.info(f"checkpoint: {folder.name} is damaged ({reason}); moved it to "
                            f"{where} and trying the previous one")
                self.ctx.run.event("checkpoint_quarantined", path=str(where), reason=reason)
            collectives.barrier()
        return None

    def resume(self) -> Loaded | None:
        started = time.monotonic()
        self.ctx.progress("load: verifying checkpoints")
        found = self.find_resumable()
        self.verify_seconds = time.monotonic() - started
        if found is None:
            return None
        folder, manifest = found
        return self.load(folder, manifest)

    def load(self, folder: Path, manifest: dict) -> Loaded:
        import torch
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
        impl = (layers_record(self.mo) or {}).get("transformer_impl", "local")
        cross_device.check_resume(folder, manifest, impl, want_distopt, fmt)
        template = ckstate.loading_template(self.mo, with_rng=same_layout, fmt=fmt)
        template["hpctrain"] = None
        kept = cross_device.set_aside_absent_entries(template, folder, "checkpoint")
        loaded = dist_checkpointing.load(template, str(folder), _load_strategy(folder))
        common = loaded["hpctrain"]
        cross_device.put_back(loaded, kept)
        ckstate.load_model_state(self.mo.model, loaded)
        ckstate.load_optimizer_state(self.mo.optimizer, loaded["optimizer"],
                                     int(common["optimizer_updates"]))
        restore_rng, why_not = cross_device.restore_rng_here(
            manifest, loaded.get("rng"), self.ctx.device, same_layout)
        if restore_rng:
            rng.restore(loaded["rng"], self.ctx.device)
        del loaded
        if self.ctx.device == "cuda":
            torch.cuda.synchronize()
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
            logger.info(f"checkpoint: resumed from {folder} (step {common['step']}, "
                        f"{manifest.get('total_bytes', 0) / 1e6:.1f} MB in {seconds:.2f}s){note}")
        return Loaded(step=int(common["step"]), path=folder, common=common, manifest=manifest,
                      seconds=seconds, same_layout=same_layout)
