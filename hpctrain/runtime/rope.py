"""RoPE in one kernel without Transformer Engine: megatron-core's own RoPE, compiled.

megatron-core applies rotary embeddings with ``fused_apply_rotary_pos_emb`` when
``apply_rope_fusion`` is on (``models/common/embeddings/rope_utils.py``, read from that module
at every call), and that function is Transformer Engine's: without TE the config refuses the
fusion and the unfused path runs about ten elementwise kernels per tensor (cos, sin, casts,
two halves, a negation, two products, a sum, a concatenation), each a pass over Q or K.
:func:`install` puts in its place megatron's unfused formula (``_apply_rotary_pos_emb_bshd``)
compiled by ``torch.compile``: the same arithmetic (computed in fp32 inside the kernel and
rounded once, as TE's kernel does), one kernel forward and one backward.

Only where TE is missing, only on CUDA, only for the sequence-first (bshd) layout hpctrain
uses; with TE its own kernel stays. Imports torch and megatron: call inside a rank.
"""

from __future__ import annotations

_installed: str | None = None


def install() -> str:
    """Make megatron's fused RoPE available; returns whose it is ('transformer_engine' or
    'torch.compile')."""
    global _installed
    from megatron.core.models.common.embeddings import rope_utils
    if _installed is not None:
        return _installed
    if rope_utils.fused_apply_rotary_pos_emb is not None:
        _installed = "transformer_engine"
        return _installed
    import torch
    compiled = torch.compile(rope_utils._apply_rotary_pos_emb_bshd)

    def fused_apply_rotary_pos_emb(t, freqs, transpose_output_memory=False, interleaved=False):
        return compiled(t, freqs, rotary_interleaved=interleaved)

    rope_utils.fused_apply_rotary_pos_emb = fused_apply_rotary_pos_emb
    _installed = "torch.compile"
    return _installed
