"""Run torch's fused attention (TorchFusedAttention) and megatron-core's DotProductAttention on
the same inputs, forward and backward, and write what they gave.

A script for a process of its own (it installs the CPU shim and forms a one-rank process
group, which must not happen inside the test runner)::

    python tests/runtime/attention_probe.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys

from hpctrain.runtime import cpu_shim

cpu_shim.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: E402
from megatron.core.transformer.dot_product_attention import DotProductAttention  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from hpctrain.runtime import fused_attention  # noqa: E402

torch.set_num_threads(1)


def config(heads: int, groups: int, dtype, dropout: float = 0.0, **extra) -> TransformerConfig:
    return TransformerConfig(num_layers=1, hidden_size=heads * 16, num_attention_heads=heads,
                             num_query_groups=groups, attention_dropout=dropout,
                             params_dtype=dtype, bf16=dtype == torch.bfloat16,
                             masked_softmax_fusion=False, **extra)


def run(module, q, k, v, grad):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = module(q, k, v, None, attn_mask_type=AttnMaskType.causal)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def max_error(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def compare(name: str, heads: int, groups: int, dtype, layer_number: int = 1,
            native_gqa: bool | None = None, **extra) -> dict:
    """``native_gqa=False``: the path taken where no enabled kernel takes grouped key/value
    heads (cuDNN's, the memory-efficient kernel's on a GPU): key and value repeated first."""
    torch.manual_seed(7)
    s, b, d = 48, 2, 16
    q = torch.randn(s, b, heads, d, dtype=dtype)
    k = torch.randn(s, b, groups, d, dtype=dtype)
    v = torch.randn(s, b, groups, d, dtype=dtype)
    grad = torch.randn(s, b, heads * d, dtype=dtype)
    cfg = config(heads, groups, dtype, **extra)
    kw = dict(config=cfg, layer_number=layer_number, attn_mask_type=AttnMaskType.causal,
              attention_type="self")
    reference = run(DotProductAttention(**kw), q, k, v, grad)
    module = fused_attention.TorchFusedAttention(**kw)
    module.native_gqa = native_gqa
    fused = run(module, q, k, v, grad)
    # the exact answer in fp64, to judge both implementations by the same yardstick
    exact = run(fused_attention.TorchFusedAttention(**{**kw, "config": config(
        heads, groups, torch.float64, **extra)}), *(t.double() for t in (q, k, v)),
        grad.double())
    return {"name": name, "dtype": str(dtype).replace("torch.", ""), "heads": heads,
            "groups": groups,
            "fused_vs_unfused": [max_error(a, r) for a, r in zip(fused, reference)],
            "unfused_vs_exact": [max_error(r, e) for r, e in zip(reference, exact)],
            "fused_vs_exact": [max_error(a, e) for a, e in zip(fused, exact)],
            "parameters": sum(1 for _ in fused_attention.TorchFusedAttention(**kw).parameters()),
            "kernel": dict(fused_attention.KERNEL_IN_USE), "native_gqa": module.native_gqa}


def dropout_case() -> dict:
    """Dropout draws from megatron's model-parallel RNG tracker: the same tracker state gives
    the same output, another state another output, and the expected value is kept."""
    dtype = torch.float32
    cfg = config(4, 4, dtype, dropout=0.5)
    module = fused_attention.TorchFusedAttention(
        config=cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    module.train()
    torch.manual_seed(3)
    q, k, v = (torch.randn(16, 1, 4, 16) for _ in range(3))
    outs = []
    for seed in (11, 11, 12):
        model_parallel_cuda_manual_seed(seed)
        outs.append(module(q, k, v, None))
    module.eval()
    no_dropout = module(q, k, v, None)
    return {"same_seed_equal": bool(torch.equal(outs[0], outs[1])),
            "other_seed_differs": not torch.equal(outs[0], outs[2]),
            "differs_from_no_dropout": not torch.equal(outs[0], no_dropout)}


def main() -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", str(29500 + os.getpid() % 2000)))
    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    out = {"cases": [
        compare("MHA fp32", 4, 4, torch.float32),
        compare("GQA fp32", 4, 2, torch.float32),
        compare("MQA fp32", 4, 1, torch.float32),
        compare("MHA bf16", 4, 4, torch.bfloat16),
        compare("GQA bf16", 4, 2, torch.bfloat16),
        compare("GQA fp32 key/value repeated", 4, 2, torch.float32, native_gqa=False),
        compare("GQA fp32 query-key layer scaling", 4, 2, torch.float32, layer_number=3,
                apply_query_key_layer_scaling=True),
    ], "dropout": dropout_case()}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
