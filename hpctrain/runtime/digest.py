"""A fingerprint of the model's weights, computed where they live (``weights_digest``).

Equal digests mean bitwise-equal weights on the same layout: how tests show a resumed or
requeued run ends exactly where an uninterrupted one does. Hashing every byte on the host
(copy each shard to the CPU, SHA-256 it) costs tens of seconds per attempt on a multi-GB GPU
shard; instead each parameter's bits, read as integers, are summed on the device with fixed
pseudo-random odd 64-bit weights (a linear hash modulo 2^64; integer sums do not depend on
the reduction order, so it is deterministic), one sum per segment of up to 4M values. Only
those sums (8 bytes per 4M values) reach the host, where SHA-256 binds them to the
parameter names and shapes; the ranks' hex digests are then hashed in rank order. Any
single changed bit changes the sum of its segment, so bitwise comparisons keep their
meaning; the digest is not meant to resist a deliberate forgery.
"""

from __future__ import annotations

import hashlib

SEGMENT = 1 << 22
SEED = 0x5EED_D16E57


def _weights(device):
    import torch
    gen = torch.Generator().manual_seed(SEED)
    w = torch.randint(-(1 << 62), 1 << 62, (SEGMENT,), dtype=torch.int64, generator=gen) | 1
    return w.to(device)


def _as_integers(t):
    import torch
    flat = t.detach().contiguous().view(-1)
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    return flat.view(as_int)


def local_digest(modules, keep=None) -> str:
    """This rank's digest over the parameters of ``modules`` (sorted by name per module; only
    those ``keep(param)`` accepts, when given)."""
    import torch
    h = hashlib.sha256()
    sums, weights = [], None
    for chunk in modules:
        for name, p in sorted(chunk.named_parameters(), key=lambda kv: kv[0]):
            if keep is not None and not keep(p):
                continue
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
            if weights is None:
                weights = _weights(p.device)
            words = _as_integers(p)
            for start in range(0, words.numel(), SEGMENT):
                seg = words[start:start + SEGMENT].long()
                sums.append((seg * weights[:seg.numel()]).sum())
    if sums:
        h.update(repr(torch.stack(sums).tolist()).encode())   # one copy to the host
    return h.hexdigest()


def weights_digest(modules) -> str:
    """SHA-256 of every rank's :func:`local_digest`, in rank order (collective)."""
    from . import collectives
    parts = collectives.gather_objects(local_digest(modules))
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def stored_weights_digest(modules) -> str:
    """The digest of the weights a checkpoint stores: one copy of each (collective).

    A checkpoint keeps one copy of a replicated parameter (megatron-core's main replica:
    tensor-parallel rank 0's copy of a parameter every TP rank holds, one data-parallel
    rank's copy). The copies are equal in exact arithmetic, but need not be bitwise on every
    device (on the CPU, torch's vectorized kernels round by the data's memory alignment, which
    differs between processes), and a resume gives every rank the stored copy. So the digest
    taken at a save and the one after a load cover data-parallel rank 0's parameters, and of
    the tensor-parallel-replicated ones (norms, biases of row-parallel layers, position
    embeddings) TP rank 0's."""
    from megatron.core import parallel_state as ps

    from . import collectives
    mine = ""
    if ps.get_data_parallel_rank() == 0:
        tp_rank = ps.get_tensor_model_parallel_rank()
        mine = local_digest(modules, keep=lambda p: tp_rank == 0 or bool(
            getattr(p, "tensor_model_parallel", False)))
    parts = collectives.gather_objects(mine)
    return hashlib.sha256("".join(parts).encode()).hexdigest()
