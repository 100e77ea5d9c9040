"""The CPU shim (hpctrain.runtime.cpu_shim) makes megatron-core's CUDA RNG tracker work on the
CPU whatever the import order: the runtime imports megatron-core before it knows its device,
and megatron-core binds ``torch.cuda._lazy_call`` by name at import. Each case runs in a fresh
interpreter, because the shim and the import order are per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.megatron

PROBE = textwrap.dedent("""
    import json, sys
    import torch
    if sys.argv[1] == "megatron-first":
        from hpctrain.runtime.versions import import_megatron_core
        import_megatron_core()          # as the runtime's rank does, before its device is known
    from hpctrain.runtime import cpu_shim
    cpu_shim.install()
    from megatron.core.tensor_parallel import random as mrandom
    tracker = mrandom.CudaRNGStatesTracker()
    tracker.add("tracked", 123)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    queued = len(torch.cuda._queued_calls)
    draws = []
    for _ in range(50):                 # fifty forks, as fifty dropouts would
        with tracker.fork("tracked"):
            draws.append(torch.rand(3).tolist())
    stream = torch.Generator().manual_seed(123)
    expected = [torch.rand(3, generator=stream).tolist() for _ in range(50)]
    print(json.dumps({"draws_are_the_tracked_stream": draws == expected,
                      "default_generator_untouched": torch.equal(before, torch.get_rng_state()),
                      "queued_calls_added": len(torch.cuda._queued_calls) - queued}))
""")


@pytest.mark.parametrize("order", ["megatron-first", "shim-first"])
def test_a_fork_of_the_rng_tracker_draws_its_own_stream_and_queues_nothing(order):
    """Inside ``fork`` the draws are the tracked state's stream, the default generator is as it
    was before, and nothing is left in torch's queue of calls deferred until CUDA starts (torch's
    own ``_lazy_call`` queued each fork's state change with a stack trace and never ran it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PROBE, order], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"draws_are_the_tracked_stream": True, "default_generator_untouched": True,
                   "queued_calls_added": 0}, got
