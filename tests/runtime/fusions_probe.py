"""The GPU speedups that run without Transformer Engine, on the CPU: torch.compile'd RoPE
(hpctrain.runtime.rope) against megatron-core's unfused RoPE, and megatron-core's native fused
cross entropy against its unfused one in bf16, forward and backward. A script for a process of
its own (CPU shim, a one-rank process group)::

    python tests/runtime/fusions_probe.py OUT.json
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

torch.set_num_threads(1)


def rope() -> dict:
    from megatron.core.models.common.embeddings import rope_utils

    from hpctrain.runtime import rope as compiled_rope
    before = rope_utils.fused_apply_rotary_pos_emb
    whose = compiled_rope.install()
    torch.manual_seed(0)
    s, b, h, d = 32, 2, 4, 16
    freqs = torch.randn(s, 1, 1, d)
    out = {"whose": whose, "was_missing": before is None}
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.randn(s, b, h, d, dtype=dtype)
        grad = torch.randn(s, b, h, d, dtype=dtype)
        results = []
        for fn in (rope_utils.fused_apply_rotary_pos_emb,
                   lambda x, f: rope_utils._apply_rotary_pos_emb_bshd(x, f)):
            x = t.clone().requires_grad_()
            y = fn(x, freqs)
            y.backward(grad)
            results.append((y.detach().float(), x.grad.float()))
        (y1, g1), (y2, g2) = results
        out[str(dtype).replace("torch.", "")] = {"forward": (y1 - y2).abs().max().item(),
                                                 "backward": (g1 - g2).abs().max().item()}
    return out


def cross_entropy() -> dict:
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
    torch.manual_seed(1)
    s, b, v = 16, 2, 64
    logits = (3 * torch.randn(s, b, v)).bfloat16()
    target = torch.randint(0, v, (s, b))
    grad = torch.rand(s, b)
    results = []
    for fn in (lambda x, t: fused_vocab_parallel_cross_entropy(
                   x, t, parallel_state.get_tensor_model_parallel_group()),
               vocab_parallel_cross_entropy):
        x = logits.clone().requires_grad_()
        loss = fn(x, target)
        loss.backward(grad)
        results.append((loss.detach().float(), x.grad.float(), x.grad.dtype))
    (l1, g1, d1), (l2, g2, d2) = results
    return {"loss": (l1 - l2).abs().max().item(), "grad": (g1 - g2).abs().max().item(),
            "grad_dtypes": [str(d1), str(d2)]}


def main() -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", str(29500 + os.getpid() % 2000)))
    dist.init_process_group("gloo")
    parallel_state.initialize_model_parallel(1, 1)
    out = {"rope": rope(), "cross_entropy": cross_entropy()}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
