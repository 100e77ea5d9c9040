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


def local_digest(modules) -> str:
    """This rank's digest over the parameters of ``modules`` (sorted by name per module)."""
    import torch
    h = hashlib.sha256()
    sums, weights = [], None
    for chunk in modules:
        for name, p in sorted(chunk.named_parameters(), key=lambda kv: kv[0]):
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
