"""The parallel layout of a job on a cluster: TP × PP × DP = world size, and what that implies.

One function decides whether (job, world size) is a valid layout and says every reason it is
not; the CLI, the planner and the runtime all call it, so a layout the runtime would refuse
is refused before anything is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .job import JobConfig
from .problems import Problems


@dataclass(frozen=True)
class Layout:
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int | None
    data_parallel_size: int
    micro_batch_size: int
    global_batch_size: int

    @property
    def world_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * \
            self.data_parallel_size

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size)

    def describe(self) -> str:
        vpp = self.virtual_pipeline_model_parallel_size
        return (f"TP{self.tensor_model_parallel_size}×PP{self.pipeline_model_parallel_size}"
                + (f"×VPP{vpp}" if vpp else "") + f"×DP{self.data_parallel_size}")


def layout_problems(job: JobConfig, world_size: int, gpus_per_node: int | None,
                    problems: Problems, *, tp: int | None = None, pp: int | None = None,
                    vpp: int | None | str = "job", mbs: int | None = None,
                    sequence_parallel: bool | None = None) -> Layout | None:
    """Check a layout; add every problem to ``problems``; return the Layout if it is valid.

    ``tp``/``pp``/``vpp``/``mbs`` override the job's values (the planner explores them);
    ``vpp="job"`` means "take the job's value".
    """
    par, m, b = job.parallel, job.model, job.batch
    tp = par.tensor_model_parallel_size if tp is None else tp
    pp = par.pipeline_model_parallel_size if pp is None else pp
    vpp = par.virtual_pipeline_model_parallel_size if vpp == "job" else vpp
    mbs = b.micro_batch_size if mbs is None else mbs
    sp = par.sequence_parallel if sequence_parallel is None else sequence_parallel
    before = len(problems.items)
    tp_key = "parallel.tensor_model_parallel_size"
    vpp_key = "parallel.virtual_pipeline_model_parallel_size"

    dp = None
    if world_size % (tp * pp):
        problems.add(tp_key, f"TP ({tp}) × PP ({pp}) = {tp * pp} does not divide the world size "
                             f"({world_size} = nodes × GPUs per node); change TP/PP or the node count")
    else:
        dp = world_size // (tp * pp)
        if par.data_parallel_size is not None and par.data_parallel_size != dp:
            problems.add("parallel.data_parallel_size",
                         f"{par.data_parallel_size} does not match world size {world_size} / "
                         f"(TP {tp} × PP {pp}) = {dp}; remove it or change the node count")
    if gpus_per_node and tp > gpus_per_node:
        problems.add(tp_key, f"TP ({tp}) spans more than one node ({gpus_per_node} GPUs per node); "
                             "tensor parallelism needs the intra-node link, keep TP ≤ GPUs per node")
    elif gpus_per_node and gpus_per_node % tp:
        problems.add(tp_key, f"TP ({tp}) does not divide the GPUs per node ({gpus_per_node})")
    if m.num_attention_heads % tp:
        problems.add(tp_key, f"num_attention_heads ({m.num_attention_heads}) is not divisible by "
                             f"TP ({tp})")
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_query_groups and groups % tp:
        problems.add(tp_key, f"num_query_groups ({groups}) is not divisible by TP ({tp})")
    ffn = m.ffn_hidden_size or 4 * m.hidden_size
    if ffn % tp:
        problems.add(tp_key, f"ffn_hidden_size ({ffn}) is not divisible by TP ({tp})")
    if vpp is not None:
        if vpp < 1:
            problems.add(vpp_key, f"must be at least 1 (or null), got {vpp}")
        elif pp < 2:
            problems.add(vpp_key, f"interleaving (VPP {vpp}) needs pipeline_model_parallel_size > 1")
    chunks = pp * (vpp or 1)
    if m.num_layers % chunks:
        what = f"PP ({pp}) × VPP ({vpp})" if vpp else f"PP ({pp})"
        problems.add("model.num_layers", f"{m.num_layers} layers do not split evenly over {what} = "
                                         f"{chunks} model chunks")
    if sp and tp < 2:
        problems.add("parallel.sequence_parallel", "needs tensor_model_parallel_size > 1")
    if sp and m.seq_length % tp:
        problems.add("parallel.sequence_parallel", f"seq_length ({m.seq_length}) must be divisible "
                                                   f"by TP ({tp})")
    if dp is not None:
        if b.global_batch_size % (mbs * dp):
            problems.add("batch.global_batch_size", f"{b.global_batch_size} is not divisible by "
                                                    f"micro_batch_size ({mbs}) × DP ({dp}) = {mbs * dp}")
        else:
            nmb = b.global_batch_size // (mbs * dp)
            if vpp and nmb % pp:
                problems.add("batch.global_batch_size",
                             f"the interleaved schedule needs the number of microbatches ({nmb}) "
                             f"to be divisible by PP ({pp})")
            if vpp and nmb < pp:
                problems.add("batch.global_batch_size", f"{nmb} microbatches are fewer than the "
                                                        f"{pp} pipeline stages")
    if len(problems.items) > before or dp is None:
        return None
    return Layout(tp, pp, vpp, dp, mbs, b.global_batch_size)
