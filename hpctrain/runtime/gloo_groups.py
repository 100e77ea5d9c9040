"""One gloo device for all of a CPU rank's process groups.

torch gives every gloo process group a device of its own, and each device runs an event loop
thread that wakes every 10 ms (gloo's ``tcp::Loop`` polls ``epoll_wait`` with a 10 ms timeout
to notice its shutdown). megatron-core's ``initialize_model_parallel`` creates a few dozen
groups, and on the CPU rehearsal every one of them is gloo: a rank then makes thousands of
wake-ups a second doing nothing, about a twentieth of a core per rank while it waits at a
barrier, a hold or a slow peer (measured: 31 idle groups, 0.27 CPU-s per 5 s; with one shared
device 0.02). Gloo's devices are made to be shared by many contexts (one listening socket and
one loop, pairs per context), and torch takes a device list in ``ProcessGroupGloo``'s options:
:func:`share_one_device` makes every gloo group this process creates from then on use the
first one.

Only for the CPU rehearsal (installed with :mod:`hpctrain.runtime.cpu_shim`); on GPUs the
groups are NCCL and the few gloo ones keep torch's default. Imports torch.
"""

from __future__ import annotations

import datetime

_installed = False


def share_one_device() -> bool:
    """Make every gloo process group created from now on share one device; False (and
    nothing changed) where this torch's ``ProcessGroupGloo`` takes no device list."""
    global _installed
    if _installed:
        return True
    from torch.distributed import distributed_c10d as c10d
    base = getattr(c10d, "ProcessGroupGloo", None)
    if base is None or not hasattr(base, "_Options") or not hasattr(base._Options(), "_devices"):
        return False
    devices: list = []
    torch_init = base.__init__

    def __init__(self, store, rank, size, timeout=datetime.timedelta(seconds=1800)):
        """torch's constructor, given the process's one device (made at first use) unless the
        caller passed options of its own. The class stays torch's: isinstance checks (the
        timeouts ``_set_pg_timeout`` sets, among them) see gloo groups as gloo."""
        if not isinstance(timeout, datetime.timedelta):
            torch_init(self, store, rank, size, timeout)
            return
        if not devices:
            devices.append(base.create_default_device())
        options = base._Options()
        options._timeout = timeout
        options._devices = devices
        torch_init(self, store, rank, size, options)

    base.__init__ = __init__
    _installed = True
    return True
