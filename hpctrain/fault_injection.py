"""Test-only environment variables: faults injected into a run, and stand-ins for a node.

Every variable a test sets to make a run misbehave, or to make preflight read a fixture instead
of this machine, is listed in ``VARIABLES`` and read through :func:`value`, which returns None
unless ``HPCTRAIN_TEST_HOOKS=1`` is set too. The tests set that switch (``tests/conftest.py``,
their profiles' ``env``, their rank launcher), so a ``HPCTRAIN_TEST_*`` variable left in a
user's shell can never reach a real job. A rank with active hooks says so in a warning line.

This module is the registry and the switch, read by preflight, the launcher's identity and the
runtime alike; what a training rank does with its variables is :mod:`hpctrain.runtime.faults`.
"""

from __future__ import annotations

import os
from typing import Mapping

from .errors import UsageError

SWITCH = "HPCTRAIN_TEST_HOOKS"

VARIABLES = {
    # the training runtime
    "HPCTRAIN_TEST_STEP_SLEEP_S": "=0.5: sleep this long in every step (slow a run down so a "
                                  "test can signal it mid-run)",
    "HPCTRAIN_TEST_CRASH_AT_STEP": "=N[@R]: raise an exception in step N (on rank R, or every "
                                   "rank)",
    "HPCTRAIN_TEST_NAN_AT_STEP": "=N[,M,...]: make the loss (and so the gradients) NaN in those "
                                 "steps",
    "HPCTRAIN_TEST_HOLD_AFTER_STEP": "=N[,M]: after step N every rank waits until it is told to "
                                     "stop (a handled signal, or the batch shell's flag file) or "
                                     "the file RUN/hold-release appears (holding a step "
                                     "number: the holds up to that step): a test acts on a run "
                                     "that is certainly mid-way, however fast the machine trains",
    "HPCTRAIN_TEST_HOLD_IN_EVAL_AT_STEP": "=N: in the evaluation after step N, after its "
                                          "first batch, every rank waits as "
                                          "HPCTRAIN_TEST_HOLD_AFTER_STEP does (a test signals "
                                          "a run that is certainly evaluating); first attempt "
                                          "only",
    "HPCTRAIN_TEST_HOLD_MAX_S": "=600: the longest a hold waits",
    "HPCTRAIN_TEST_KILL_DURING_SAVE": "=R[@N]: rank R SIGKILLs itself after writing its shards of "
                                      "a checkpoint (of step N, or the first one) and before it "
                                      "is published; in the run's first attempt only (a fault "
                                      "to recover from, where a crash at a step repeats in every "
                                      "attempt like a bug would)",
    "HPCTRAIN_TEST_SLOW_WRITER_S": "=SECONDS: every background save's writer waits this long "
                                   "before it writes (first attempt only): the next save comes "
                                   "while the writer still reads the staged bytes",
    "HPCTRAIN_TEST_SLOW_WRITER_ITEM_S": "=SECONDS: every background save's writer takes this "
                                        "long for each item it writes (first attempt only): a "
                                        "long write that advances, which is not a hang",
    "HPCTRAIN_TEST_FILL_AFTER_SAVE": "=1: once a background save is scheduled, allocate memory "
                                     "of every size it staged (pinned on a GPU: where a released "
                                     "staging buffer would be reused), first asking the save's "
                                     "own host memory for it, and fill it with 0xA5 while the "
                                     "writer runs; the resume then checks the weights it loads "
                                     "against the digest taken at the save",
    "HPCTRAIN_TEST_PAGE_LOCK_S": "=SECONDS: on the CPU, the checkpoint staging memory is "
                                 "page-locked as on a GPU, each segment taking SECONDS (a "
                                 "stand-in for cudaHostRegister): page-locking starts after the "
                                 "attempt's first step, and a save waits for it",
    "HPCTRAIN_TEST_READ_THREADS": "=N: a resume reads its checkpoint with N threads (0: "
                                  "megatron-core's own reader, one thread, the files verified "
                                  "in a pass before it), to compare parallel and serial loads",
    "HPCTRAIN_TEST_FILE_SIZE_LIMIT_AT_SAVE": "=BYTES@N: before the checkpoint save of step N, "
                                             "every rank may write no file past BYTES "
                                             "(RLIMIT_FSIZE: the save fails with EFBIG, a real "
                                             "storage fault); first attempt only",
    "HPCTRAIN_TEST_HANG_IN_COLLECTIVE": "=N@R: in step N rank R blocks forever in the next "
                                        "collective megatron-core issues (the others then wait "
                                        "for it in that collective); first attempt only",
    "HPCTRAIN_TEST_SLOW_RANK": "=R:S: rank R's every forward pass does S more CPU-seconds of "
                               "work (a slow device: the straggler detector should name its "
                               "node); first attempt only",
    # preflight
    "HPCTRAIN_TEST_NODE_NAME": "=NAME: this process's node name, so tests run several "
                               "\"nodes\" on one host",
    "HPCTRAIN_TEST_PREFLIGHT_DELAY": "=<rank|node>:<seconds>: that rank or node sleeps before "
                                     "each collective (slow or stuck on purpose)",
    "HPCTRAIN_TEST_SYSFS_IB": "=DIR: read InfiniBand ports from DIR instead of "
                              "/sys/class/infiniband",
    "HPCTRAIN_TEST_SYSFS_NET": "=DIR: read network interfaces from DIR instead of /sys/class/net",
    "HPCTRAIN_TEST_PROC_MOUNTS": "=FILE: read the mount table from FILE instead of /proc/mounts",
    "HPCTRAIN_TEST_SITE_PACKAGES": "=DIR[:DIR]: read installed package metadata from these "
                                   "folders (a GPU node's software) instead of sys.path",
}


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(SWITCH) == "1"


def value(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The test variable ``name`` when the switch is on and it is set; else None."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a registered test variable (fault_injection.VARIABLES)")
    env = os.environ if env is None else env
    return (env.get(name) or None) if enabled(env) else None


def ignored(env: Mapping[str, str] | None = None) -> list[str]:
    """Test variables that are set but have no effect because the switch is off."""
    env = os.environ if env is None else env
    return [] if enabled(env) else sorted(k for k in VARIABLES if env.get(k))


def preflight_delay(rank: int, node: str, env: Mapping[str, str] | None = None) -> float:
    """Seconds this preflight rank sleeps before each collective (0 normally)."""
    spec = value("HPCTRAIN_TEST_PREFLIGHT_DELAY", env) or ""
    if not spec:
        return 0.0
    target, _, secs = spec.rpartition(":")
    try:
        seconds = float(secs)
    except ValueError:
        raise UsageError(f"HPCTRAIN_TEST_PREFLIGHT_DELAY={spec!r}: expected <rank|node>:<seconds>") \
            from None
    hit = target == node or (target.isdigit() and int(target) == rank)
    return seconds if hit else 0.0
