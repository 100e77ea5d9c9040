"""Rank-side probe: the runtime's validation and test loss (``runtime.evaluation``) on real
megatron-core models, on one layout after another, each cut short or not.

Each layout's model chunks get weights that do not depend on the layout: every tensor of the
model's sharded state dict is filled from a generator seeded by its checkpoint key, over its
global shape, and each rank keeps its own slice (as a checkpoint reshards), so the model is
the same function on one rank and on TP2 × PP2 × VPP2. Dropout is on: a model left in
training mode during an evaluation gives another loss at every call.

On each layout the evaluator comes from :func:`build_evaluator` (the job's 80/10/10 split,
validation every 2 steps and a test at the end), and runs:

* ``plain``, ``again``: the validation loss twice (the same number, bit for bit);
* ``test``: the test loss;
* ``signal``: a preemption signal on the last rank only;
* ``deadline_mid``: rank 0's time limit near from the first batch on;
* ``deadline_second``: near from the second batch on (of three);
* ``deadline_last``: near only once the last batch is done (``next_batch_s`` is 0);
* ``deadline_elsewhere``: near on every rank but rank 0 (only rank 0's clock counts).

One rank alone also computes the reference loss by hand: the model's per-token loss on each
sample of the first ``eval_iters`` global batches, averaged. Each rank writes
``OUT/LAYOUT-rank-R.json``.

    python -m tests.runtime.evaluation_probe PREFIX OUT LAYOUT [LAYOUT ...]
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

# vocabulary 256 padded to a multiple of 128 × TP: 256 on one rank and on TP2 alike (the
# embedding's global shape, and so its weights, must not depend on the layout)
MODEL = dict(vocab_size=256, make_vocab_size_divisible_by=128, hidden_dropout=0.2,
             attention_dropout=0.2)
TRAIN = dict(eval_interval=2, eval_iters=3, eval_at_end=True)
HOLD_S = 0.25      # the test hook holds the first batch of every evaluation this long
DATA_SPLIT = "80,10,10"
STEP = 6
BATCH = dict(micro_batch_size=2, global_batch_size=8)


def fill_by_key(chunks) -> int:
    """Every tensor of the chunks' sharded state: this rank's slice of a global tensor drawn
    from a generator seeded by its key (layout-independent weights). Returns how many."""
    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.dist_checkpointing.dict_utils import nested_values

    filled = 0
    with torch.no_grad():
        for m in chunks:
            for sh in nested_values(m.sharded_state_dict()):
                if not isinstance(sh, ShardedTensor) or not torch.is_tensor(sh.data) or \
                        not sh.data.is_floating_point():
                    continue
                g = torch.Generator().manual_seed(zlib.crc32(sh.key.encode()))
                full = torch.randn(sh.global_shape, generator=g, dtype=torch.float64) * 0.5
                where = tuple(slice(o, o + n) for o, n in
                              zip(sh.global_offset, (1,) * sh.prepend_axis_num + sh.local_shape))
                sh.data.copy_(full[where].reshape(sh.data.shape))
                filled += 1
    return filled


class _Calls(list):
    """Stand-ins' methods that record each call, in order, as JSON: ``[name, *kept]``
    (``keep``: which of the call's arguments, or the value of ``phase=``)."""

    def method(self, name: str, keep: slice, pause: float = 0.0):
        def call(*args, **kwargs):
            self.append([name, *(args[keep] if args else [kwargs["phase"]])])
            time.sleep(pause)
        return call


class _Logged(list):
    """The lines the ``hpctrain`` logger gives out in this rank, as the rank's log would."""

    def __init__(self) -> None:
        super().__init__()
        import logging
        handler = logging.Handler()
        handler.emit = lambda record: self.append(record.getMessage())
        log = logging.getLogger("hpctrain")
        log.handlers[:] = [handler]
        log.setLevel(logging.INFO)
        log.propagate = False


def reference_loss(mo, samples, layout, iters: int) -> float:
    """The validation loss by hand, one rank, no schedule: the mean over every token of the
    first ``iters`` global batches of the model's per-token loss, in eval mode."""
    import torch
    seq = samples.seq_length
    positions = torch.arange(seq).unsqueeze(0)
    total, tokens = 0.0, 0
    for m in mo.model:
        m.eval()
    with torch.no_grad():
        for position in range(iters * layout.global_batch_size):
            rows = torch.from_numpy(samples.sample(position, check=False)).long().unsqueeze(0)
            losses = mo.model[0](rows[:, :-1], positions, None, labels=rows[:, 1:])
            total += float(losses.double().sum())
            tokens += losses.numel()
    for m in mo.model:
        m.train()
    return total / tokens


def one_layout(name: str, prefix: str, out: Path, renv) -> None:
    import torch
    from megatron.core import parallel_state as ps

    from hpctrain.config import job_from_mapping
    from hpctrain.data.blend import split_samples
    from hpctrain.runtime.evaluation import build_evaluator
    from hpctrain.runtime.model import build_model_chunks, initialize_parallel, \
        transformer_config
    from tests.runtime.helpers import TINY_MODEL, job_mapping

    job = job_from_mapping(job_mapping(prefix, name, model={**TINY_MODEL, **MODEL},
                                       train=TRAIN, data={"split": DATA_SPLIT}, batch=BATCH),
                           "job")
    p, b = job.parallel, job.batch
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    from hpctrain.config.layout import Layout
    layout = Layout(tp, pp, p.virtual_pipeline_model_parallel_size,
                    renv.world_size // (tp * pp), b.micro_batch_size, b.global_batch_size)
    initialize_parallel(layout, job.train.seed)
    chunks = build_model_chunks(job, layout, "cpu", transformer_config(job, layout, "cpu"))
    filled = fill_by_key(chunks)
    mo = SimpleNamespace(model=chunks)
    calls = _Calls()
    flag = SimpleNamespace(requested=False, check_file=lambda: False)
    ctx = SimpleNamespace(job=job, layout=layout, is_rank0=renv.rank == 0, device="cpu",
                          run=SimpleNamespace(path=out), watchdog=SimpleNamespace(
                              progress=calls.method("progress", slice(0))))
    # kind, step, loss, iters, samples (not the seconds it took)
    metrics = SimpleNamespace(record_eval=calls.method("record_eval", slice(0, 5)))
    # the hold comes inside the first batch's time: that batch is the slowest of each
    # evaluation, whatever this machine's speed
    hooks = SimpleNamespace(hold_in_evaluation=calls.method("hold", slice(0, 1), HOLD_S))
    logged = _Logged()
    ev = build_evaluator(ctx, mo, {}, flag, metrics, hooks)
    seen = {"dp": ps.get_data_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
            "stage": ps.get_pipeline_model_parallel_rank(), "filled": filled,
            "kinds": sorted(ev.feeders), "reports_loss": ev.reports_loss,
            "due": [ev.due(s) for s in range(1, 7)], "built_log": list(logged)}
    if renv.world_size == 1:
        # what ends a test hook's hold: the batch shell's flag file, or a file the test makes
        released = [ev.released()]
        (out / "hold-release").touch()
        released.append(ev.released())
        (out / "hold-release").unlink()
        flag.check_file = lambda: True
        released.append(ev.released())
        flag.check_file = lambda: False
        seen["released"] = released
    if renv.world_size == 1:      # jobs that evaluate less: no model run needed
        for case, train in (("none", {"eval_interval": None, "eval_at_end": False}),
                            ("test_only", {"eval_interval": None, "eval_at_end": True})):
            other = job_from_mapping(job_mapping(prefix, name, model={**TINY_MODEL, **MODEL},
                                                 train=train, data={"split": DATA_SPLIT}), "job")
            built = build_evaluator(SimpleNamespace(**{**vars(ctx), "job": other}), mo, {}, flag,
                                    metrics, hooks)
            seen[case] = None if built is None else {
                "kinds": sorted(built.feeders), "due": [built.due(s) for s in range(1, 7)]}

    def run(case: str, kind: str = "validation", deadline=None, signal: bool = False):
        calls.clear()
        logged.clear()
        flag.requested = signal
        asked: list[float] = []
        # how long after the evaluation began, on the clock the evaluator times its batches
        # with (the wall clock can be slewed or stepped while the monotonic one runs on)
        asked_at: list[float] = []
        started = time.perf_counter()

        def near(next_s: float) -> bool:
            asked.append(next_s)
            asked_at.append(time.perf_counter() - started)
            return deadline(len(asked), next_s)
        ev.deadline_near = near if deadline is not None else None
        r = ev.evaluate(kind, STEP)
        seen[case] = {"loss": r.loss, "kind": r.kind, "iters": r.iters,
                      "stopped_by": r.stopped_by, "seconds": r.seconds, "asked": asked,
                      "asked_at": asked_at,
                      "calls": list(calls), "log": list(logged),
                      "training_after": [m.training for m in chunks],
                      "reader_left": ev.feeders[kind]._it is not None}

    run("plain")
    run("again")
    run("test", kind="test")
    run("signal", signal=renv.rank == renv.world_size - 1)
    # the deadline's answer, given how many times it was asked and the next batch's time
    run("deadline_mid", deadline=lambda n, next_s: next_s is not None)
    run("deadline_second", deadline=lambda n, next_s: n >= 2)
    run("deadline_last", deadline=lambda n, next_s: next_s is None)
    run("deadline_elsewhere", deadline=(lambda n, next_s: True) if renv.rank else None)
    if renv.world_size == 1:
        for kind, split in (("validation", "valid"), ("test", "test")):
            samples = split_samples(job.data, split, job.model.seq_length, job.train.seed,
                                    job.model.vocab_size, {})
            seen[f"reference_{kind}"] = reference_loss(mo, samples, layout, job.train.eval_iters)
    Path(out, f"{name}-rank-{renv.rank}.json").write_text(json.dumps(seen))
    del ev, chunks, mo
    torch.distributed.barrier()
    ps.destroy_model_parallel()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    prefix, out, layouts = args[0], Path(args[1]), args[2:]
    from hpctrain.identity import rank_env
    from hpctrain.runtime import cpu_shim
    from hpctrain.runtime.distributed import init_process_group
    cpu_shim.install()
    renv = rank_env()
    init_process_group(renv, "cpu", 600)
    for name in layouts:
        one_layout(name, prefix, out, renv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
