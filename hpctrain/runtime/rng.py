"""Every random state a rank has, captured for a checkpoint and restored on resume.

Python's and numpy's generators, torch's CPU generator, the CUDA generator (on a GPU) and
megatron's model-parallel RNG tracker (the streams dropout draws from, which differ per
tensor-parallel rank). Restoring them all is what makes a resumed run bitwise identical to
an uninterrupted one. On the CPU rehearsal the shim makes "cuda" the CPU generator, so the
tracker's states are CPU generator states and there is no separate CUDA state: states are
restored only on the device that saved them (``checkpoint.cross_device``).
"""

from __future__ import annotations

import random


def capture(device: str) -> dict:
    import numpy as np
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "device": device,   # restored only onto the same kind of generators (cross_device)
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if device == "cuda" else None,
        "tracker": get_cuda_rng_tracker().get_states(),
    }


def restore(state: dict, device: str) -> None:
    import numpy as np
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])
