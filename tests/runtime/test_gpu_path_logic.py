"""The GPU-path settings that need no process group: manual GC, the flag-file watcher, the
CUDA connection setting, the per-stage seed rule, who reads data, the device-side weights
digest, and the job fields behind them."""

from __future__ import annotations

import gc
import signal
import time

import pytest

from hpctrain.config import job_from_mapping
from hpctrain.config.layout import Layout
from hpctrain.errors import ConfigError
from hpctrain.runtime.distributed import set_device_connections
from hpctrain.runtime.manual_gc import ManualGC
from hpctrain.runtime.preemption import PreemptionFlag
from tests.conftest import wait_until
from tests.runtime.helpers import job_mapping


# ------------------------------------------------------------------------------- manual GC
def test_manual_gc_turns_automatic_collection_off_and_collects_every_n_steps():
    full = []

    def count(phase, info):
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    was = gc.isenabled()
    gc.enable()
    gc.callbacks.append(count)
    try:
        g = ManualGC(enabled=True, interval=3)
        g.start()
        assert not gc.isenabled() and len(full) == 1          # one collection before step 1
        for step in range(1, 10):
            g.after_step(step)
        assert len(full) == 1 + 3 == g.collections             # steps 3, 6, 9
        g.stop()
        assert gc.isenabled()
        once = ManualGC(enabled=True, interval=0)
        once.start()
        for step in range(1, 50):
            once.after_step(step)
        once.stop()
        assert once.collections == 1
        off = ManualGC(enabled=False, interval=3)
        off.start()
        off.after_step(3)
        assert gc.isenabled() and off.collections == 0
    finally:
        gc.callbacks.remove(count)
        gc.enable() if was else gc.disable()


def test_manual_gc_leaves_collection_off_when_it_was_off_before():
    was = gc.isenabled()
    gc.disable()
    try:
        g = ManualGC(enabled=True, interval=1)
        g.start()
        g.stop()
        assert not gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


# ------------------------------------------------------------------------------- flag file
def test_the_flag_file_is_seen_by_the_watcher_without_the_step_asking(tmp_path):
    path = tmp_path / "signal-flag"
    flag = PreemptionFlag("USR1", str(path))
    flag.watch_file(interval_s=0.05)
    try:
        watcher = flag._watcher
        flag.watch_file(interval_s=0.05)            # asked again: still the one watcher
        assert flag._watcher is watcher
        time.sleep(0.2)
        assert not flag.requested
        path.touch()
        wait_until(lambda: flag.requested, timeout=30, interval=0.05, what="the watcher")
        assert flag.received == "flag file"
    finally:
        flag.stop_watching()
    assert flag._watcher is None
    nothing_to_watch = PreemptionFlag("USR1", None)
    nothing_to_watch.watch_file()                   # no flag file (ranks other than 0): no thread
    assert nothing_to_watch._watcher is None


def test_the_watcher_stops_when_the_rank_stands_down(tmp_path):
    flag = PreemptionFlag("USR1", str(tmp_path / "never"))
    flag.watch_file(interval_s=0.05)
    thread = flag._watcher[0]
    assert thread.is_alive() and thread.daemon
    # standing down ignores the signal in this process: put back as it was, or every later
    # test on the worker, and every process it starts (an ignored signal is inherited),
    # would ignore SIGUSR1
    before = signal.getsignal(signal.SIGUSR1)
    try:
        flag.stand_down()
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert not thread.is_alive() and not flag.requested


# ------------------------------------------------------------------------------- CUDA queues
def test_one_cuda_connection_with_tensor_parallelism_unless_the_profile_says_otherwise():
    tp1, tp2 = Layout(1, 2, None, 2, 1, 8), Layout(2, 1, None, 2, 1, 8)
    env: dict[str, str] = {}
    assert set_device_connections(tp1, env) is None and env == {}
    assert set_device_connections(tp2, env) is None and env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    note = set_device_connections(tp2, env)
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8" and "requires 1" in note


# ------------------------------------------------------------------------------- who reads
def test_only_tp_rank_0_of_the_first_and_last_stages_reads_data():
    from hpctrain.runtime.batches import reads_data
    assert reads_data(0, True, False) and reads_data(0, False, True) and reads_data(0, True, True)
    assert not reads_data(1, True, True)           # receives from TP rank 0
    assert not reads_data(0, False, False)         # a middle stage: no data at all


def test_stage_seeds_follow_megatron_lm():
    from hpctrain.runtime.model import stage_seed
    assert [stage_seed(1234, r) for r in range(3)] == [1234, 1334, 1434]


# ------------------------------------------------------------------------------- digest
def test_device_digest_changes_with_any_bit_and_only_then():
    import torch
    from hpctrain.runtime.digest import SEGMENT, local_digest

    def model(dtype):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8))
        return m.to(dtype)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a, b = model(dtype), model(dtype)
        assert local_digest([a]) == local_digest([b])
        with torch.no_grad():
            w = b[1].weight.view(-1)
            bits = w.view({2: torch.int16, 4: torch.int32}[w.element_size()])
            bits[5] ^= 1                                     # one bit of one value
        assert local_digest([a]) != local_digest([b])
    big = torch.nn.Linear(SEGMENT // 1000 + 1, 1001, bias=False)   # more than one segment
    before = local_digest([big])
    with torch.no_grad():
        big.weight.view(-1)[SEGMENT + 3] += 1.0
    assert local_digest([big]) != before
    renamed = torch.nn.Sequential(torch.nn.Identity(), model(torch.float32)[0])
    assert local_digest([renamed]) != local_digest([model(torch.float32)[:1]])  # names count


# ------------------------------------------------------------------------------- job fields
def _problems(**sections) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        job_from_mapping(job_mapping("/data", "single", **sections), "job.yaml")
    return dict(err.value.problems)


def test_overlap_fields_default_on_and_are_checked():
    job = job_from_mapping(job_mapping("/data", "tp2pp2vpp2"), "job.yaml")
    p = job.parallel
    assert p.overlap_grad_reduce and p.overlap_param_gather and p.overlap_p2p_comm
    assert p.ddp_bucket_size is None and job.train.manual_gc and job.train.manual_gc_interval == 100
    assert job.data.num_workers is None
    assert "at least 1" in _problems(parallel={"ddp_bucket_size": 0})["parallel.ddp_bucket_size"]
    got = _problems(parallel={"pipeline_model_parallel_size": 2,
                              "virtual_pipeline_model_parallel_size": 2, "overlap_p2p_comm": False})
    assert "3 or more stages" in got["parallel.overlap_p2p_comm"]
    job_from_mapping(job_mapping("/data", "single", parallel={
        "pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2,
        "overlap_p2p_comm": False}), "job.yaml")         # PP4: batched p2p is fine
    assert "at least 0" in _problems(train={"manual_gc_interval": -1})["train.manual_gc_interval"]
    assert "at least 0" in _problems(data={"num_workers": -2})["data.num_workers"]

