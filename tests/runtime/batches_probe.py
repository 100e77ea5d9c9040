"""Rank-side probe: what each rank's forward step is fed, step after step and after a resume.

Four ranks form TP2 × DP2 (gloo) and each builds the runtime's :class:`BatchFeeder` over one
indexed corpus, as the training loop does. A stand-in model records the tokens and labels the
forward step hands it (its ``pre_process``/``post_process`` flags as a one-stage model's).
Two steps are fed from sample 0 on (the second continues the first's reader), then the feeder
is moved to sample 296 (a resume elsewhere) and fed the step after it with two model chunks,
then moved back to sample 8; last, a stage that only embeds, one that only scores and a middle
stage are each fed from sample 16. Each rank writes what it saw to ``OUT/rank-R.json``.

    python -m tests.runtime.batches_probe PREFIX OUT [pipeline]

With ``pipeline``: six ranks, PP3 × DP2 with two model chunks per stage (:func:`pipeline`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

SEQ = 16
LAYOUT = SimpleNamespace(global_batch_size=8, micro_batch_size=2, data_parallel_size=2)
MICROBATCHES = 2          # global batch 8 = 2 DP ranks × 2 microbatches × micro-batch 2
# (consumed samples, model chunks) of each step: two from the start, then a resume at sample
# 296 (past the corpus's first epoch), the step after it with two chunks, and a move back to
# sample 8 (a reload of an earlier checkpoint)
STEPS = ((0, 1), (8, 1), (296, 1), (304, 2), (8, 1))
# then one microbatch each, from sample 16 on, for a stage that only embeds, one that only
# scores and a middle stage
STAGES = ((True, False), (False, True), (False, False))


class _Recorder:
    """A pipeline stage (``pre_process``: it embeds, ``post_process``: it scores; both, as
    without pipelining, by default): records what it is given, returns per-token losses of the
    rows' label ids (a number the test can check the loss against)."""

    def __init__(self, pre_process: bool = True, post_process: bool = True) -> None:
        self.pre_process, self.post_process = pre_process, post_process
        self.seen: list[dict] = []

    def __call__(self, tokens, positions, mask, labels=None):
        import torch
        self.seen.append({"tokens": None if tokens is None else tokens.tolist(),
                          "labels": None if labels is None else labels.tolist(),
                          "positions": None if positions is None else positions[0].tolist()})
        return labels.float() if labels is not None else torch.zeros(LAYOUT.micro_batch_size, SEQ)


def pipeline(prefix: str, out: str) -> int:
    """PP3 × DP2 with two model chunks per stage (interleaved 1F1B): one step of the chunks
    that use data. The first stage's first chunk embeds, the last stage's last chunk scores;
    the middle stage reads nothing."""
    from megatron.core import parallel_state as ps

    from hpctrain.data.gpt_dataset import GPTSamples
    from hpctrain.data.indexed import IndexedDataset
    from hpctrain.identity import rank_env
    from hpctrain.runtime.batches import BatchFeeder
    from hpctrain.runtime.distributed import init_process_group

    renv = rank_env()
    init_process_group(renv, "cpu", 600)
    ps.initialize_model_parallel(pipeline_model_parallel_size=3,
                                 virtual_pipeline_model_parallel_size=2)
    feeder = BatchFeeder(GPTSamples(IndexedDataset(prefix), SEQ, 1234), LAYOUT, "cpu")
    stage = ps.get_pipeline_model_parallel_rank()
    its = feeder.iterators(0, 2)
    seen = []
    for chunk in range(2):
        model = _Recorder(pre_process=stage == 0 and chunk == 0,
                          post_process=stage == 2 and chunk == 1)
        for _ in range(MICROBATCHES):
            feeder.forward_step()(its[chunk], model)
        seen.append(model.seen)
    Path(out, f"rank-{renv.rank}.json").write_text(json.dumps({
        "dp": ps.get_data_parallel_rank(), "stage": stage, "reads": feeder.reads,
        "microbatches_read": feeder.microbatches_read, "seen": seen,
        "iterators": [it is not None for it in its]}))
    feeder.close()
    ps.destroy_model_parallel()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    prefix, out = args[:2]
    if args[2:] == ["pipeline"]:
        return pipeline(prefix, out)
    from megatron.core import parallel_state as ps

    from hpctrain.data.gpt_dataset import GPTSamples
    from hpctrain.data.indexed import IndexedDataset
    from hpctrain.identity import rank_env
    from hpctrain.runtime.batches import BatchFeeder, step_loss
    from hpctrain.runtime.distributed import init_process_group

    renv = rank_env()
    init_process_group(renv, "cpu", 600)
    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    feeder = BatchFeeder(GPTSamples(IndexedDataset(prefix), SEQ, 1234), LAYOUT, "cpu")
    model = _Recorder()
    steps, same_reader = [], []
    for consumed, chunks in STEPS:
        before = feeder._it
        its = feeder.iterators(consumed, chunks)
        it = its[0] if isinstance(its, list) else its
        same_reader.append(before is not None and it is before)
        reports = []
        for i in range(MICROBATCHES):
            output, loss = feeder.forward_step()(its[i % chunks] if chunks > 1 else its, model)
            reports.append(loss(output)[1])
        steps.append({"consumed": consumed, "chunks": len(its) if isinstance(its, list) else 1,
                      "loss": float(step_loss(reports, MICROBATCHES))})
    stages = []
    its = feeder.iterators(16, 1)           # one step, its microbatches to the three stages
    for pre, post in STAGES:
        stage = _Recorder(pre, post)
        read = feeder.microbatches_read
        feeder.forward_step()(its, stage)
        stages.append({**stage.seen[0], "read": feeder.microbatches_read - read})
    Path(out, f"rank-{renv.rank}.json").write_text(json.dumps({
        "stages": stages,
        "dp": ps.get_data_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
        "reads": feeder.reads, "microbatches_read": feeder.microbatches_read,
        "num_workers": feeder.num_workers,
        "seen": model.seen, "steps": steps, "same_reader": same_reader}))
    feeder.close()
    ps.destroy_model_parallel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
