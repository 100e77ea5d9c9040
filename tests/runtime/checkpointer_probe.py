"""Rank-side probe: the collective half of checkpointing (``runtime.checkpoint.manager``) over
several attempts of one run, on real megatron-core models and optimizers (PP2 × VPP2 × DP2:
two model chunks per rank, the distributed optimizer), in seconds instead of a training run's
minutes.

Each attempt builds a fresh model and optimizer and a fresh :class:`Checkpointer`, as a new
attempt's ranks do. The optimizer takes real steps from gradients drawn per parameter name and
step (the same on every DP replica), so Adam's moments and step count are not trivial.

Attempt 1 (``keep_last: 2``): a background save at step 1 published by ``poll()``; the same
step again (skipped); an emergency save at step 2 (synchronous); two background saves at
steps 3 and 4 back to back, published by ``wait()``; the pruning that leaves 3 and 4. What the
state was at step 4, and what one more step from there gives, are kept.

Attempt 2: a partial folder from a save that never finished is lying there; ``resume()`` sets
it aside and loads step 4 into the fresh model: weights, Adam's moments and step, the RNG
streams and the common state as saved; one more step gives what attempt 1's step 5 gave. It
saves step 5 (final). Checks before loading refuse a manifest of weights only, one saved
without the distributed optimizer, a dp_reshardable one on another TP size, and one whose data
fingerprint is not the job's (another seed); the job's own fingerprint is accepted.

Attempt 3: a byte of step 5 flipped: the load's CRC32C catches it, step 5 is set aside, step 4
loads. Attempt 4: step 4 damaged too, the only one left: the attempt stops (CheckpointError);
it saves step 6. Attempt 5 reads the older format's way (the read threads set to 0: every
file read once before loading, shared out over the ranks): step 6 damaged in a file that
rank 0 does not check is set aside, nothing is left, ``resume()`` returns None. Another run
using this folder is refused on every rank, and a save whose folder rank 0 cannot make fails
on every rank.

Each rank writes ``OUT/rank-R.json``; rank 0 adds the run's events and the folder's names.

Then a third run saves the distributed optimizer as dp_reshardable, and a fourth trains without
it; each one's resume gives back the state and the next step as well.

    python -m tests.runtime.checkpointer_probe RUN OTHER_RUN DP_RESHARDABLE_RUN NO_ZERO1_RUN OUT
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
import zlib
from pathlib import Path

from tests.conftest import flip_byte

FLIPPED_AT = 4096      # the byte flipped inside a data file (past its header)
TIED = {"output_layer.weight": "embedding.word_embeddings.weight",
        "embedding.word_embeddings.weight": "embedding.word_embeddings.weight"}


def _grads(mo, step: int) -> None:
    """Every parameter's gradient, drawn from its name and the step: equal on DP replicas,
    and on the two stages' copies of the tied embedding (as the embedding's all-reduce
    leaves them)."""
    import torch
    for i, m in enumerate(mo.model):
        for name, p in m.module.named_parameters():
            name = TIED.get(name, f"{i}.{name}")     # the tied copies: one name in any chunk
            g = torch.Generator().manual_seed(zlib.crc32(f"{name}.{step}".encode()))
            p.main_grad.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _digest(tensors) -> str:
    import torch
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def weights(mo) -> str:
    """This rank's weights (the runtime's own per-rank digest of every parameter)."""
    from hpctrain.runtime.digest import local_digest
    return local_digest([m.module for m in mo.model])


def optimizer_state(mo) -> dict:
    """This rank's Adam moments and main parameters (digests), and the step count."""
    import torch
    from hpctrain.runtime.checkpoint.state import sub_optimizers
    moments, mains, steps, group_steps = [], [], set(), set()
    for o in sub_optimizers(mo.optimizer):
        inner = getattr(o, "optimizer", o)
        for group in inner.param_groups:
            for p in group["params"]:
                mains.append(p)
                st = inner.state.get(p, {})
                moments += [st[k] for k in ("exp_avg", "exp_avg_sq") if k in st]
                if "step" in st:
                    s = st["step"]
                    steps.add(float(s.item() if torch.is_tensor(s) else s))
            if "step" in group:
                group_steps.add(float(group["step"]))
    # torch's Adam counts per parameter (``steps``); a step in the param groups is what
    # megatron's state dict carried over, which torch's Adam does not read
    return {"moments": _digest(moments), "mains": _digest(mains), "count": len(moments),
            "steps": sorted(steps), "group_steps": sorted(group_steps)}


def rng_draws() -> list:
    import numpy
    import torch
    return [random.random(), float(torch.rand(1)), float(numpy.random.rand())]


def snapshot(mo) -> dict:
    return {"weights": weights(mo), "optimizer": optimizer_state(mo)}


class Probe:
    def __init__(self, run_dir: str, other_dir: str, out: Path) -> None:
        from hpctrain.identity import rank_env
        from hpctrain.record.folder import RunFolder
        from hpctrain.runtime import distributed
        from hpctrain.runtime.log import setup
        from hpctrain.runtime.model import initialize_parallel

        self.other = RunFolder(Path(other_dir))
        self.out = out
        self.renv = rank_env()
        setup(self.renv.rank)
        self.use(run_dir)
        self.main = self.run
        distributed.prepare_device("cpu", self.renv)
        distributed.init_process_group(self.renv, "cpu", 600)
        initialize_parallel(self.layout, self.job.train.seed)
        from megatron.core import parallel_state as ps
        self.seen: dict = {"rank": self.renv.rank, "dp": ps.get_data_parallel_rank(),
                           "stage": ps.get_pipeline_model_parallel_rank()}
        self.phases: list[str] = []

    def use(self, run_dir: str) -> None:
        """The run (its job, profile, layout and checkpoint folder) the next attempts are of."""
        from hpctrain.planner.layouts import with_optimizer_format
        from hpctrain.record.folder import RunFolder
        from hpctrain.runtime.entry import resolve_layout
        self.run = RunFolder(Path(run_dir))
        job, self.profile = self.run.resolved_job(), self.run.resolved_profile()
        self.layout = resolve_layout(job, self.profile, self.renv.world_size)
        self.job = with_optimizer_format(job, self.profile, self.layout)
        self.root = self.run.checkpoint_dir(self.job, self.profile)

    @property
    def rank0(self) -> bool:
        return self.renv.rank == 0

    def attempt(self, number: int, run=None, root: Path | None = None, **hooks):
        """A fresh model, optimizer and Checkpointer, as attempt ``number``'s ranks build them."""
        from types import SimpleNamespace

        from hpctrain.runtime.checkpoint.manager import Checkpointer
        from hpctrain.runtime.context import RankContext
        from hpctrain.runtime.faults import TestHooks
        from hpctrain.runtime.job_env import job_env
        from hpctrain.runtime.model import build_model_and_optimizer

        mo = build_model_and_optimizer(self.job, self.layout, "cpu")
        ctx = RankContext(run=run or self.run, job=self.job, profile=self.profile,
                          layout=self.layout, env=self.renv, job_env=job_env(), attempt=number,
                          device="cpu")
        phases = self.phases
        ctx.watchdog = SimpleNamespace(progress=lambda phase: phases.append(phase))
        test_hooks = TestHooks.from_env()
        for k, v in hooks.items():
            setattr(test_hooks, k, v)
        ckpt = Checkpointer(ctx, mo, root or self.root, test_hooks)
        published: list[int] = []
        ckpt.on_published = published.append
        return mo, ckpt, published

    def step(self, mo, step: int) -> None:
        """One optimizer step; the updated shards gathered on every DP replica, as the next
        forward's pre-hook would with ``overlap_param_gather``."""
        _grads(mo, step)
        mo.optimizer.step()
        if self.job.parallel.use_distributed_optimizer:
            for m in mo.model:
                m.start_param_sync(force_sync=True)

    @staticmethod
    def common(step: int) -> dict:
        return {"step": step, "consumed_samples": 16 * step, "optimizer_updates": step,
                "lr_schedule": {"num_steps": step}, "guard": {"skipped": 0}}

    def barrier(self) -> None:
        import torch
        torch.distributed.barrier()

    def flip_byte(self, folder: Path, name: str | None = None, at: int | None = FLIPPED_AT) -> str:
        """Rank 0 flips one byte of a data file (the largest, or ``name``; at ``at``, None:
        the middle one); sizes unchanged."""
        if self.rank0:
            files = sorted(folder.glob("*.distcp"), key=lambda p: (-p.stat().st_size, p.name))
            target = folder / name if name else files[0]
            flip_byte(target, at)
            name = target.name
        self.barrier()
        return name or ""

    def look(self, seen: dict, quarantine: bool = True) -> dict:
        """The checkpoint folder's names once every rank is done with it, and before any
        rank goes on to change it."""
        self.barrier()
        seen["folders"] = self.folders()
        if quarantine:
            seen["quarantined"] = self.quarantined()
        self.barrier()
        return seen

    def folders(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir()) if self.root.exists() else []

    def quarantined(self) -> list[str]:
        q = self.root / "quarantine"
        return sorted(p.name for p in q.iterdir()) if q.exists() else []

    def resume(self, ckpt) -> dict:
        """``resume()``'s answer on this rank: what it loaded, or the error it raised."""
        from hpctrain.record.checkpoint_store import CheckpointError
        self.phases.clear()
        began = time.monotonic()
        try:
            loaded = ckpt.resume()
        except CheckpointError as e:
            return {"error": type(e).__name__, "message": str(e)}
        if loaded is None:
            return {"loaded": None, "phases": list(self.phases)}
        return {"loaded": loaded.step, "path": loaded.path.name, "common": loaded.common,
                "same_layout": loaded.same_layout,
                "manifest_attempt": loaded.manifest.get("attempt"),
                "read": {k: ckpt.read_stats.get(k) for k in
                         ("items", "verified", "digest_checked")},
                "phases": list(self.phases),
                # what it says about its own time, and the time measured around it
                "stats": ckpt.read_stats, "seconds": loaded.seconds,
                "verify_seconds": ckpt.verify_seconds, "wall": time.monotonic() - began}

    # ------------------------------------------------------------------ the attempts
    def first(self) -> None:
        seen = self.seen["first"] = {}
        mo, ckpt, published = self.attempt(1)
        seen["resume"] = self.resume(ckpt)      # nothing yet: the folder is claimed
        self.step(mo, 1)
        seen["at_1"] = snapshot(mo)
        self.phases.clear()
        began = time.monotonic()
        info = ckpt.save(1, self.common(1), "periodic", sync=False)
        seen["after_schedule"] = {"pending": [p["step"] for p in ckpt.pending],
                                  "published": ckpt.last_published_step,
                                  "stall": "stall_seconds" in info,
                                  "digest": info["digest"]}
        polls = 0
        while ckpt.pending:         # (a save that never ends: the launch's timeout)
            ckpt.poll()             # collective: every rank sees the same answer each time
            polls += 1
            time.sleep(0.05)
        seen["after_poll"] = {"pending": [p["step"] for p in ckpt.pending],
                              "published": ckpt.last_published_step,
                              "path": Path(ckpt.last_published_path or "").name,
                              "polls": polls, "phases": list(self.phases)}
        again = ckpt.save(1, self.common(1), "periodic", sync=False)
        seen["again"] = {"skipped": again.get("skipped"), "path": Path(again["path"]).name}
        self.step(mo, 2)
        seen["at_2"] = snapshot(mo)
        self.phases.clear()
        info = ckpt.save(2, self.common(2), "emergency", sync=True)
        seen["sync"] = {"pending": [p["step"] for p in ckpt.pending],
                        "published": ckpt.last_published_step, "path": Path(info["path"]).name,
                        "phases": sorted(set(self.phases))}
        self.step(mo, 3)
        ckpt.save(3, self.common(3), "periodic", sync=False)
        seen["pending_3"] = [p["step"] for p in ckpt.pending]
        # a fault while step 3 is written in the background: named by its own step when the
        # step is not known (poll, wait), by the step given otherwise
        seen["fault_while_pending"] = [self.storage_fault(ckpt, None), self.storage_fault(ckpt, 9)]
        self.step(mo, 4)
        # step 4 written slowly, as on a busy file system (each item 50 ms): the wait for it
        # hears of every item the writer wrote since its last look
        ckpt.hooks.slow_writer_item_s, ckpt.WRITER_PROGRESS_POLL_S = 0.05, 0.05
        ckpt.save(4, self.common(4), "periodic", sync=False)
        seen["pending_4"] = [p["step"] for p in ckpt.pending]
        seen["published_before_wait"] = ckpt.last_published_step
        self.phases.clear()
        ckpt.wait()
        ckpt.hooks.slow_writer_item_s = 0.0
        seen["after_wait"] = {"pending": [p["step"] for p in ckpt.pending],
                              "published": ckpt.last_published_step}
        seen["wait_phases"] = list(self.phases)
        seen["at_4"] = snapshot(mo)
        seen["draws_after_4"] = rng_draws()   # the streams as saved at step 4, drawn from
        seen["saves_wall"] = time.monotonic() - began    # every save's whole time within it
        seen["saves"] = [{k: s.get(k) for k in ("step", "reason", "sync", "stall_seconds",
                                                "seconds", "total_seconds", "bytes")}
                         for s in ckpt.saves]
        seen["digest_4"] = ckpt.saves[-1]["digest"]
        if self.rank0:
            from hpctrain.record import checkpoint_store as store
            seen["manifests"] = {n: {k: v for k, v in store.read_manifest(self.root / n).items()
                                     if k != "files"}
                                 for n in ("step-00000003", "step-00000004")}
            seen["sizes"] = sum(p.stat().st_size for p in (self.root / "step-00000004").iterdir()
                                if p.name != store.MANIFEST)
            seen["layers"] = mo.layers.record()
        seen["on_published"] = published
        ckpt.close()
        self.step(mo, 5)
        seen["at_5"] = snapshot(mo)
        self.look(seen, quarantine=False)

    def second(self) -> None:
        seen = self.seen["second"] = {}
        if self.rank0:          # a save that never finished, left by a killed attempt
            left = self.root / ".partial-step-00000005-a1"
            left.mkdir()
            (left / "__0_0.distcp").write_bytes(b"half")
        self.barrier()
        mo, ckpt, published = self.attempt(2)
        random.seed(99)                     # streams elsewhere: only a restore brings them back
        seen["resume"] = self.resume(ckpt)
        seen["draws"] = rng_draws()
        seen["at_4"] = snapshot(mo)
        seen["fault_after_resume"] = self.storage_fault(ckpt)
        self.step(mo, 5)
        seen["at_5"] = snapshot(mo)
        folder = ckpt.root / "step-00000004"
        seen["refused"] = self.refusals(ckpt, folder)
        began = time.monotonic()
        info = ckpt.save(5, self.common(5), "final", sync=True)
        seen["save_wall"] = time.monotonic() - began
        seen["saved"] = Path(info["path"]).name
        seen["save"] = {k: info.get(k) for k in ("stall_seconds", "seconds", "total_seconds")}
        if self.rank0:
            from hpctrain.record import checkpoint_store as store
            seen["manifest"] = {k: v for k, v in store.read_manifest(Path(info["path"])).items()
                                if k != "files"}
        seen["on_published"] = published
        ckpt.close()
        self.look(seen)

    @staticmethod
    def storage_fault(ckpt, step: int | None = 9) -> str:
        """What a save of ``step`` failing on the storage would say now (None: a fault in
        ``poll()`` or ``wait()``, which know no step)."""
        import errno
        try:
            with ckpt._storage_faults(step):
                raise OSError(errno.ENOSPC, "No space left on device", str(ckpt.root / "x"))
        except Exception as e:  # noqa: BLE001 - the one line
            return str(e)
        return "no fault"

    def refusals(self, ckpt, folder: Path) -> dict:
        """The checks made before anything is read: each answer (the error's first words)."""
        from hpctrain.record import checkpoint_store as store
        from hpctrain.record.checkpoint_store import CheckpointError
        manifest = store.read_manifest(folder)
        layout = manifest["layout"]
        cases = {
            "weights_only": {**manifest, "kind": "weights"},
            "no_distributed_optimizer": {**manifest,
                                         "layout": {**layout, "distributed_optimizer": False}},
            "dp_reshardable_other_tp": {**manifest, "optimizer_format": "dp_reshardable",
                                        "layout": {**layout, "tp": 2, "describe": "TP2"}},
        }
        # the data fingerprint of a save made under another seed (7), and the job's own
        import dataclasses
        from hpctrain.data.fingerprint import data_fingerprint
        here = data_fingerprint(self.job, "feistel-v1")
        seed = dataclasses.replace(self.job, train=dataclasses.replace(self.job.train, seed=7))
        cases["data_changed"] = {**manifest, "data": data_fingerprint(seed, "feistel-v1")}
        out = {}
        try:
            ckpt.check_data_position(folder, {**manifest, "data": here})
            out["data_same"] = "accepted"
        except CheckpointError as e:
            out["data_same"] = str(e)
        for name, m in cases.items():
            try:
                ckpt.load(folder, m)
                out[name] = "loaded"
            except CheckpointError as e:
                out[name] = str(e)
        # the change accepted for this checkpoint (`hpctrain resume --accept-data-change`
        # records it in the run's events, which rank 0 reads): it loads
        if self.rank0:
            self.run.event("data_change_accepted", checkpoint=folder.name)
        self.barrier()
        try:
            ckpt.check_data_position(folder, cases["data_changed"])
            out["data_accepted"] = "accepted"
        except CheckpointError as e:
            out["data_accepted"] = str(e)
        # a checkpoint from before the weights' digest was recorded loads, unchecked
        older = {k: v for k, v in manifest.items() if k != "weights_digest"}
        out["without_digest"] = {"loaded": ckpt.load(folder, older).step,
                                 "digest_checked": ckpt.read_stats.get("digest_checked", False)}
        return out

    def third(self) -> None:
        seen = self.seen["third"] = {}
        seen["flipped"] = self.flip_byte(self.root / "step-00000005")
        mo, ckpt, _ = self.attempt(3)
        seen["resume"] = self.resume(ckpt)
        seen["at_4"] = snapshot(mo)
        ckpt.close()
        self.look(seen)

    def fourth(self) -> None:
        seen = self.seen["fourth"] = {}
        self.flip_byte(self.root / "step-00000004")
        mo, ckpt, _ = self.attempt(4)
        seen["resume"] = self.resume(ckpt)
        self.step(mo, 6)
        info = ckpt.save(6, self.common(6), "final", sync=True)
        seen["saved"] = Path(info["path"]).name
        ckpt.close()
        self.look(seen)

    def fifth(self) -> None:
        from hpctrain.record import checkpoint_store as store
        seen = self.seen["fifth"] = {}
        folder = self.root / "step-00000006"
        names = sorted(store.read_manifest(folder)["files"])
        # a file of another rank's share: rank 0 alone would not see the damage
        theirs = [n for n in names if n.endswith(".distcp")
                  and n not in store.share(names, 0, self.renv.world_size)]
        seen["damaged"] = self.flip_byte(folder, theirs[0])
        mo, ckpt, _ = self.attempt(5, read_threads=0)
        seen["resume"] = self.resume(ckpt)
        ckpt.close()
        self.look(seen)
        # another run pointed at this folder: refused on every rank, nothing moved
        mo, ckpt, _ = self.attempt(1, run=self.other)
        seen["foreign"] = self.resume(ckpt)
        ckpt.close()
        seen["folders_after_foreign"] = self.look({}, quarantine=False)["folders"]
        # rank 0 cannot make the save's folder (a file where it should be): every rank hears
        # why, none waits for the others forever
        blocked = Path(self.main.path, "not-a-folder")
        if self.rank0:
            blocked.write_text("")
        self.barrier()
        mo, ckpt, _ = self.attempt(5, root=blocked / "checkpoints")
        try:
            ckpt.save(7, self.common(7), "periodic", sync=False)
            seen["blocked"] = "saved"
        except Exception as e:  # noqa: BLE001 - what each rank was told
            seen["blocked"] = {"error": type(e).__name__, "message": str(e)}
        seen["blocked_pending"] = [p["step"] for p in ckpt.pending]
        ckpt.close()

    def resumes_alike(self, run_dir: str, key: str) -> None:
        """Another run on the same layout (the distributed optimizer saved as dp_reshardable,
        each rank's own shard; or no distributed optimizer): a resume gives back the state and
        the next step, as the first run's does."""
        self.use(run_dir)
        seen = self.seen[key] = {
            "format": self.job.checkpoint.optimizer_format,
            "distributed": bool(self.job.parallel.use_distributed_optimizer)}
        mo, ckpt, _ = self.attempt(1)
        ckpt.resume()
        for step in (1, 2):
            self.step(mo, step)
        ckpt.save(2, self.common(2), "periodic", sync=True)
        seen["at_2"] = snapshot(mo)
        self.step(mo, 3)
        seen["at_3"] = snapshot(mo)
        ckpt.close()
        mo, ckpt, _ = self.attempt(2)
        seen["resume"] = self.resume(ckpt)
        seen["resumed_at_2"] = snapshot(mo)
        self.step(mo, 3)
        seen["resumed_at_3"] = snapshot(mo)
        # a step past the small integers Python keeps one object of (each made anew, as a
        # training loop's counter is), saved again while its background save is pending:
        # written once
        ckpt.save(int("300"), self.common(300), "periodic", sync=False)
        again = ckpt.save(int("300"), self.common(300), "periodic", sync=False)
        seen["again_pending"] = {"skipped": again.get("skipped"),
                                 "pending": [p["step"] for p in ckpt.pending]}
        ckpt.wait()
        again = ckpt.save(int("300"), self.common(300), "periodic", sync=True)   # published
        seen["again_published"] = again.get("skipped")
        ckpt.close()

    def small_file_damaged(self, key: str) -> None:
        """A byte flipped in the middle of the newest checkpoint's ``common.pt`` (the step and
        the data position, which ``torch.load`` reads, not hpctrain's checked reader): the
        checkpoint is set aside before loading and the previous one loads."""
        seen = self.seen[key]
        seen["damaged_common"] = self.flip_byte(self.root / "step-00000300", "common.pt", None)
        mo, ckpt, _ = self.attempt(3)
        seen["common_damaged"] = self.resume(ckpt)
        seen["common_damaged_resumed_at_2"] = snapshot(mo)
        ckpt.close()
        seen["common_damaged_quarantined"] = aside = self.look({})["quarantined"]
        from hpctrain.record.checkpoint_store import QUARANTINE, QUARANTINE_NOTE
        seen["common_damaged_note"] = [
            (self.root / QUARANTINE / name / QUARANTINE_NOTE).read_text() for name in aside]

    def finish(self) -> None:
        if self.rank0:
            self.seen["events"] = [
                {k: e.get(k) for k in ("event", "step", "reason", "attempt", "path", "seconds")}
                for e in self.main.events() if e["event"].startswith("checkpoint")]
            self.seen["other_events"] = [e["event"] for e in self.other.events()]
        Path(self.out, f"rank-{self.renv.rank}.json").write_text(json.dumps(self.seen))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    from hpctrain.runtime import cpu_shim, distributed
    cpu_shim.install()
    probe = Probe(args[0], args[1], Path(args[4]))
    try:
        for part in (probe.first, probe.second, probe.third, probe.fourth, probe.fifth):
            part()
        probe.resumes_alike(args[2], "dp_reshardable")
        probe.small_file_damaged("dp_reshardable")
        probe.resumes_alike(args[3], "no_distributed_optimizer")
    finally:
        probe.finish()
    probe.barrier()
    distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
