"""The runtime's decisions without torch: LR schedules, the stability guard, deadlines and
periodic saves on a fake clock, signals, rank environments, test hooks and FLOPs."""

from __future__ import annotations

import math
import os
import signal

import pytest

from hpctrain.errors import UsageError
from hpctrain.flops import (forward_flops_per_token, mfu, model_flops_per_step,
                            model_flops_per_step_full_attention)
from hpctrain.identity import LaunchError, rank_env
from hpctrain.model_shape import ModelShape, padded_vocab_size, total_parameters
from hpctrain.runtime.faults import InjectedCrash, TestHooks
from hpctrain.runtime.guard import StabilityGuard
from hpctrain.runtime.job_env import job_env
from hpctrain.runtime.lr_schedule import LRSchedule
from hpctrain.runtime.preemption import (DeadlinePolicy, PeriodicSaves, PreemptionFlag,
                                         SaveEstimate, signal_number)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# ------------------------------------------------------------------------------- schedules
def test_warmup_then_cosine_reaches_min_lr_on_the_last_step():
    s = LRSchedule(lr=1.0, min_lr=0.1, total_steps=110, warmup_steps=10, style="cosine")
    assert [s.lr_at(k) for k in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert s.lr_at(9) == pytest.approx(1.0)
    assert s.lr_at(59) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert s.lr_at(109) == pytest.approx(0.1)
    assert s.lr_at(500) == pytest.approx(0.1)
    lrs = [s.lr_at(k) for k in range(10, 110)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_linear_constant_and_wsd():
    lin = LRSchedule(lr=2.0, min_lr=0.0, total_steps=4, warmup_steps=0, style="linear")
    assert [lin.lr_at(k) for k in range(4)] == pytest.approx([1.5, 1.0, 0.5, 0.0])
    const = LRSchedule(lr=2.0, min_lr=0.0, total_steps=4, warmup_steps=2, style="constant")
    assert [const.lr_at(k) for k in range(5)] == pytest.approx([1.0, 2.0, 2.0, 2.0, 2.0])
    wsd = LRSchedule(lr=1.0, min_lr=0.0, total_steps=100, warmup_steps=5, style="wsd")
    assert wsd.decay_steps == 10
    assert wsd.lr_at(4) == pytest.approx(1.0) and wsd.lr_at(89) == pytest.approx(1.0)
    assert wsd.lr_at(94) == pytest.approx(0.5)
    assert wsd.lr_at(99) == pytest.approx(0.0)
    short = LRSchedule(lr=1.0, min_lr=0.5, total_steps=20, warmup_steps=0, style="wsd",
                       wsd_decay_steps=4)
    assert [round(short.lr_at(k), 4) for k in (15, 16, 19)] == [1.0, 0.9268, 0.5]
    with pytest.raises(ValueError, match="unknown schedule"):
        LRSchedule(lr=1, min_lr=0, total_steps=1, style="step")


# ------------------------------------------------------------------------------- guard
def test_guard_skips_nonfinite_and_spikes_and_stops_after_the_limit():
    g = StabilityGuard(True, spike_factor=2.0, spike_window=3, max_skipped_steps=2)
    assert not g.check(4.0, 1.0).skip           # window not full: no spike rule yet
    assert not g.check(3.0, 1.0).skip
    assert not g.check(2.0, 1.0).skip
    v = g.check(float("nan"), 1.0)
    assert v.skip and "loss is nan" in v.reason and v.stop is None
    assert not g.check(2.5, 1.0).skip            # a good step resets the run of skips
    v = g.check(7.0, 1.0)                        # mean(3, 2, 2.5) = 2.5; 7 > 2 x 2.5
    assert v.skip and "loss spike" in v.reason
    v = g.check(1.0, float("inf"))
    assert v.skip and "gradient norm is inf" in v.reason
    assert "max_skipped_steps is 2" in v.stop
    assert g.skipped_total == 3
    restored = StabilityGuard(True, spike_factor=2.0, spike_window=3, max_skipped_steps=2)
    restored.load_state_dict(g.state_dict())
    assert restored.state_dict() == g.state_dict()
    assert restored.judge(7.0, 1.0) == g.judge(7.0, 1.0)


def test_guard_can_be_told_not_to_skip():
    g = StabilityGuard(skip_nonfinite=False, spike_factor=0.0, spike_window=2,
                       max_skipped_steps=5)
    assert not g.check(float("nan"), float("nan")).skip
    assert not g.check(1.0, 1.0).skip and not g.check(1.0, 1.0).skip   # the window is full
    assert not g.check(1e9, 1.0).skip


def test_a_spike_is_more_than_the_factor_times_the_mean_of_the_window():
    g = StabilityGuard(True, spike_factor=2.0, spike_window=3, max_skipped_steps=5)
    for loss in (3.0, 2.0, 2.5):                 # mean 2.5: a spike is above 5.0
        g.check(loss, 1.0)
    assert g.judge(4.9, 1.0) is None              # above 2 + 2.5 and 2 x floor(2.5), not a spike
    assert g.judge(5.0, 1.0) is None              # exactly the factor times the mean
    assert "loss spike: 5.0100 > 2 × running mean 2.5000 of the last 3 steps" == \
        g.judge(5.01, 1.0)
    one = StabilityGuard(True, spike_factor=2.0, spike_window=1, max_skipped_steps=5)
    one.check(2.0, 1.0)
    assert one.check(4.5, 1.0).skip               # a window of one step is the last loss
    strict = StabilityGuard(True, spike_factor=0.5, spike_window=1, max_skipped_steps=5)
    strict.check(2.0, 1.0)                        # a factor under 1 is still a factor
    assert strict.judge(1.5, 1.0) is not None and strict.judge(0.9, 1.0) is None


def test_the_guard_is_the_jobs_stability_section():
    from hpctrain.config import load_job
    from tests.conftest import REPO
    section = load_job(REPO / "examples" / "tiny.yaml").train.stability
    g = StabilityGuard.from_stability(section)
    assert (g.skip_nonfinite, g.spike_factor, g.spike_window, g.max_skipped_steps) == (
        section.skip_nonfinite, section.spike_factor, section.spike_window,
        section.max_skipped_steps)


def test_the_guard_counts_skips_in_a_row_across_a_resume():
    """A fresh guard has skipped nothing; a checkpoint from before the guard kept its counts
    has skipped nothing either; a resume whose job lowered max_skipped_steps below the
    skips already in a row stops at its next skip."""
    fresh = StabilityGuard(True, 2.0, 3, max_skipped_steps=2)
    assert fresh.check(float("nan"), 1.0).stop is None
    older = StabilityGuard(True, 2.0, 3, max_skipped_steps=2)
    older.load_state_dict({"history": [1.0, 1.0, 1.0]})
    assert older.check(float("nan"), 1.0).stop is None
    assert older.state_dict() == {"history": [1.0, 1.0, 1.0], "skipped_in_a_row": 1,
                                  "skipped_total": 1}
    before = StabilityGuard(True, 2.0, 3, max_skipped_steps=5)
    for _ in range(3):
        before.check(float("nan"), 1.0)
    lowered = StabilityGuard(True, 2.0, 3, max_skipped_steps=2)
    lowered.load_state_dict(before.state_dict())
    verdict = lowered.check(float("inf"), 1.0)
    assert verdict.skip and "4 updates in a row were skipped" in verdict.stop


# ------------------------------------------------------------------------------- time
def test_deadline_reserves_save_time_margin_and_one_step():
    clock = Clock(0.0)
    d = DeadlinePolicy(deadline=1000.0, safety_factor=2.0, margin_s=30.0, clock=clock)
    clock.t = 1000 - 131
    assert not d.must_stop(save_estimate_s=40, step_time_s=10)   # 869 left, need 120
    clock.t = 1000 - 119
    assert d.must_stop(save_estimate_s=40, step_time_s=10)
    assert d.time_left() == pytest.approx(119)
    assert not DeadlinePolicy(None, 2.0, 30.0, clock=clock).must_stop(1e9, 1e9)


def test_save_estimate_prefers_measurements():
    e = SaveEstimate()
    assert e.seconds == SaveEstimate.DEFAULT_S
    e = SaveEstimate(state_bytes=200_000_000)   # no measurement yet: from the bytes to write
    assert e.seconds == SaveEstimate.GUESS_OVERHEAD_S + 2.0
    e = SaveEstimate(previous_s=None, load_s=4.0)
    assert e.seconds == 4.0
    e = SaveEstimate(previous_s=12.0, load_s=4.0)
    assert e.seconds == 12.0
    e.record(10.0)
    assert e.seconds == 10.0
    e.record(30.0)           # a slower save raises the estimate at once
    assert e.seconds == 30.0
    e.record(2.0)            # a faster one lowers it only halfway
    assert e.seconds == 16.0


def test_periodic_saves_by_steps_and_by_minutes():
    clock = Clock(0.0)
    p = PeriodicSaves(interval_steps=50, interval_minutes=0, start_step=0, clock=clock)
    assert [s for s in range(1, 201) if p.due(s)] == [50, 100, 150, 200]
    p = PeriodicSaves(interval_steps=0, interval_minutes=15, clock=clock, start_step=10)
    assert not p.due(11)
    clock.t = 15 * 60 - 1
    assert not p.due(12)
    clock.t = 15 * 60
    assert p.due(13)
    p.saved(13)
    assert not p.due(14)
    assert not p.due(13)     # never twice for one step
    clock.t = 2 * 15 * 60 + 7
    assert p.due(15)         # a step boundary seldom falls on the minute itself
    p.interval_steps = 5
    assert not p.due(10)     # nor for a step before the last save
    off = PeriodicSaves(0, 0, 0, clock=clock)
    clock.t = 1e9
    assert not off.due(5)
    resumed = PeriodicSaves(5, 0.0, 10, clock=clock)     # a run resumed from step 10's save
    assert not resumed.due(10) and resumed.due(15)
    assert PeriodicSaves(1, 0.0, 0, clock=clock).due(1)   # every step: the first one too


def test_preemption_flag_from_signals_and_flag_file(tmp_path):
    flag = PreemptionFlag("USR2", flag_file=str(tmp_path / "flag"))
    flag.install()
    try:
        assert not flag.requested and not flag.check_file()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.requested and flag.received == "SIGUSR2"
        flag2 = PreemptionFlag("USR1")
        flag2.install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag2.received == "SIGTERM"
        flag2.uninstall()
    finally:
        flag.uninstall()
    late = PreemptionFlag("USR1", flag_file=str(tmp_path / "flag"))
    (tmp_path / "flag").touch()
    assert late.check_file() and late.received == "flag file"
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL



def test_a_second_ctrl_c_stops_at_once_and_only_ctrl_c_does():
    """The first Ctrl-C asks for the emergency checkpoint like a preemption signal; a second
    Ctrl-C is a person who will not wait for it. A second preemption signal is only a
    repeat (Slurm sends the warning again on a requeued step)."""
    flag = PreemptionFlag("USR1")
    flag.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert flag.received == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        flag.uninstall()
    for name in ("USR1", "HUP"):                 # HUP: a profile's signal numbered below INT
        repeated = PreemptionFlag(name)
        repeated.install()
        try:
            os.kill(os.getpid(), signal_number(name))
            os.kill(os.getpid(), signal_number(name))     # no KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
            assert repeated.received == f"SIG{name}"      # the first signal is the one recorded
        finally:
            repeated.uninstall()


def test_a_rank_that_stood_down_ignores_the_preemption_signal_but_not_sigterm():
    """After the attempt's work, a late time-limit warning (the profile's signal) must not
    kill a clean exit; SIGTERM keeps its handler (the scheduler's real stop)."""
    flag = PreemptionFlag("USR2")
    flag.install()
    try:
        flag.stand_down()
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == flag._handle
        os.kill(os.getpid(), signal.SIGUSR2)
        assert not flag.requested
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    by_sigterm = PreemptionFlag("TERM")          # a cluster that preempts with SIGTERM only
    by_sigterm.install()
    try:
        by_sigterm.stand_down()
        assert signal.getsignal(signal.SIGTERM) == by_sigterm._handle
    finally:
        by_sigterm.uninstall()


# ------------------------------------------------------------------------------- environment
def test_rank_environment_from_each_launcher():
    base = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
    slurm = rank_env({**base, "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
                      "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
                      "SLURMD_NODENAME": "n2"})
    assert (slurm.rank, slurm.local_rank, slurm.world_size, slurm.local_world_size,
            slurm.launcher, slurm.node) == (5, 1, 8, 4, "slurm", "n2")
    local = rank_env({**base, "SUBMITIT_LOCAL_GLOBALID": "2", "SUBMITIT_LOCAL_LOCALID": "2",
                      "SUBMITIT_LOCAL_NTASKS": "4"})
    assert (local.rank, local.world_size, local.launcher) == (2, 4, "submitit-local")
    both = rank_env({**base, "RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0",
                     "SLURM_NTASKS": "1"})
    assert (both.rank, both.world_size, both.launcher) == (1, 2, "torchrun")
    assert both.endpoint == "10.0.0.1:29400"
    # in a Slurm job step, a RANK/WORLD_SIZE inherited from the submitting shell loses...
    step = {**base, "RANK": "0", "WORLD_SIZE": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1", "SLURM_NTASKS": "4"}
    assert (rank_env(step).rank, rank_env(step).world_size) == (3, 4)
    # ...unless torchrun itself started the process inside the step
    torchrun = rank_env({**step, "TORCHELASTIC_RUN_ID": "x", "RANK": "2", "WORLD_SIZE": "8"})
    assert (torchrun.rank, torchrun.world_size, torchrun.launcher) == (2, 8, "torchrun")
    alone = rank_env({})
    assert (alone.rank, alone.world_size) == (0, 1)
    with pytest.raises(LaunchError, match="MASTER_PORT not set"):
        rank_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "x"})
    with pytest.raises(LaunchError, match="not in a job step"):
        rank_env({"SLURM_JOB_ID": "3"})
    with pytest.raises(LaunchError, match="not in a job step"):   # the batch script itself
        rank_env({**base, "SLURM_JOB_ID": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    # submitit's local executor: its task variables beat a RANK inherited from the shell
    both_local = rank_env({**base, "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_NTASKS": "2",
                           "RANK": "0", "WORLD_SIZE": "1", "SLURM_JOB_ID": "3"})
    assert (both_local.rank, both_local.world_size, both_local.launcher) == (1, 2, "submitit-local")
    with pytest.raises(LaunchError, match="outside the world size"):
        rank_env({**base, "RANK": "4", "WORLD_SIZE": "4"})


def test_job_environment():
    e = job_env({"HPCTRAIN_RUN_DIR": "/r", "HPCTRAIN_ATTEMPT": "3", "HPCTRAIN_DEADLINE": "17.5",
                 "HPCTRAIN_PREEMPT_SIGNAL": "USR2", "HPCTRAIN_LOG_TO_FILE": "1",
                 "SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "99"})
    assert (e.run_dir, e.attempt, e.deadline, e.preempt_signal, e.log_to_file, e.local_executor,
            e.local_job_id) == ("/r", 3, 17.5, "USR2", True, True, "99")
    assert job_env({}).attempt is None and not job_env({}).local_executor
    with pytest.raises(LaunchError, match="HPCTRAIN_ATTEMPT"):
        job_env({"HPCTRAIN_ATTEMPT": "x"})


def test_attempt_number_follows_the_ledger(tmp_path):
    from hpctrain.record.folder import RunFolder
    from hpctrain.runtime.entry import attempt_number
    run = RunFolder(tmp_path)
    assert attempt_number(run, None) == 1
    assert attempt_number(run, 4) == 4
    run.append_ledger({"attempt": 1})
    run.append_ledger({"attempt": 2})
    assert attempt_number(run, None) == 3
    assert attempt_number(run, 2) == 3      # a restarted local task inherits HPCTRAIN_ATTEMPT=2
    assert attempt_number(run, 5) == 5


ON = {"HPCTRAIN_TEST_HOOKS": "1"}


def test_test_hooks_parse_and_fire():
    h = TestHooks.from_env({**ON, "HPCTRAIN_TEST_CRASH_AT_STEP": "4@1",
                            "HPCTRAIN_TEST_NAN_AT_STEP": "3,7",
                            "HPCTRAIN_TEST_KILL_DURING_SAVE": "2@6",
                            "HPCTRAIN_TEST_STEP_SLEEP_S": "0.25"})
    assert h.active and h.step_sleep_s == 0.25 and h.nan_in(7) and not h.nan_in(4)
    h.maybe_crash(4, 0)
    with pytest.raises(InjectedCrash):
        h.maybe_crash(4, 1)
    assert not h.kill_during_save(2, 3) and not h.kill_during_save(1, 6)
    assert h.kill_during_save(2, 6) and not h.kill_during_save(2, 6)  # once
    assert not TestHooks.from_env(ON).active
    with pytest.raises(UsageError):
        TestHooks.from_env({**ON, "HPCTRAIN_TEST_CRASH_AT_STEP": "soon"})


def test_a_hold_waits_after_its_step_until_released_or_timed_out():
    h = TestHooks.from_env({**ON, "HPCTRAIN_TEST_HOLD_AFTER_STEP": "4,9",
                            "HPCTRAIN_TEST_HOLD_MAX_S": "30"})
    assert h.active and h.hold_steps == {4, 9}
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s
    polls = iter([False, False, True])
    assert h.hold_after(3, lambda: False, sleep, lambda: now[0]) and not slept   # not a hold step
    assert h.hold_after(4, lambda: next(polls), sleep, lambda: now[0]) and len(slept) == 2
    assert h.hold_after(4, lambda: False, sleep, lambda: now[0])                 # once per step
    assert not h.hold_after(9, lambda: False, sleep, lambda: now[0])             # timed out
    assert 30 <= now[0] < 31


def test_one_call_per_step_fires_every_step_hook_and_nothing_without_hooks():
    """The loop's one hook call per step: the hold after the previous step, the crash, the NaN
    flag of this step; with no hook active it asks nothing (not even whether a hold ended)."""
    asked = []

    def released():
        asked.append(True)
        return True
    quiet = TestHooks.from_env(ON)
    assert [quiet.at_step(n, 0, released=released) for n in (1, 2, 3)] == [False] * 3
    assert asked == []
    h = TestHooks.from_env({**ON, "HPCTRAIN_TEST_HOLD_AFTER_STEP": "2",
                            "HPCTRAIN_TEST_NAN_AT_STEP": "3", "HPCTRAIN_TEST_CRASH_AT_STEP": "4@1"})
    assert h.at_step(2, 1, released=released) is False and asked == []   # no hold after step 1
    assert h.at_step(3, 1, released=released) is True and asked == [True]  # held after step 2
    assert h.at_step(4, 0, released=released) is False                    # rank 0: no crash
    with pytest.raises(InjectedCrash):
        h.at_step(4, 1, released=released)


def test_test_variables_do_nothing_without_the_switch():
    """A HPCTRAIN_TEST_* variable left in a user's shell never reaches a real job: without
    HPCTRAIN_TEST_HOOKS=1 every registered test variable reads as unset."""
    from hpctrain import fault_injection
    from hpctrain.identity import node_name
    stray = {"HPCTRAIN_TEST_STEP_SLEEP_S": "5", "HPCTRAIN_TEST_CRASH_AT_STEP": "1",
             "HPCTRAIN_TEST_NAN_AT_STEP": "1,2", "HPCTRAIN_TEST_HOLD_AFTER_STEP": "1",
             "HPCTRAIN_TEST_HOLD_MAX_S": "9", "HPCTRAIN_TEST_KILL_DURING_SAVE": "0",
             "HPCTRAIN_TEST_NODE_NAME": "fake-node", "HPCTRAIN_TEST_PREFLIGHT_DELAY": "0:600",
             "HPCTRAIN_TEST_SYSFS_IB": "/x", "HPCTRAIN_TEST_SYSFS_NET": "/x",
             "HPCTRAIN_TEST_PROC_MOUNTS": "/x", "HPCTRAIN_TEST_SITE_PACKAGES": "/x",
             "HPCTRAIN_TEST_HANG_IN_COLLECTIVE": "2@1", "HPCTRAIN_TEST_SLOW_RANK": "1:0.5",
             "HPCTRAIN_TEST_HOLD_IN_EVAL_AT_STEP": "1", "HPCTRAIN_TEST_FILL_AFTER_SAVE": "1",
             "HPCTRAIN_TEST_READ_THREADS": "0", "HPCTRAIN_TEST_PAGE_LOCK_S": "0.5",
             "HPCTRAIN_TEST_FILE_SIZE_LIMIT_AT_SAVE": "1@1", "HPCTRAIN_TEST_SLOW_WRITER_S": "3",
             "HPCTRAIN_TEST_SLOW_WRITER_ITEM_S": "0.25"}
    assert set(stray) == set(fault_injection.VARIABLES)      # every registered variable
    for switch in ({}, {"HPCTRAIN_TEST_HOOKS": "0"}, {"HPCTRAIN_TEST_HOOKS": "yes"}):
        env = {**stray, **switch}
        hooks = TestHooks.from_env(env)
        assert not hooks.active and hooks.step_sleep_s == 0 and not hooks.nan_in(1)
        assert not hooks.fill_after_save and hooks.read_threads is None
        assert hooks.cpu_page_lock() is None
        hooks.maybe_crash(1, 0)                                # no crash
        assert hooks.hold_in_evaluation(1, released=lambda: False)   # no hold
        assert not hooks.kill_during_save(0, 1) and hooks.writer_delay(sync=False) == 0
        assert hooks.writer_item_delay() == 0
        assert all(fault_injection.value(k, env) is None for k in stray)
        assert node_name(env) != "fake-node" and rank_env(env).node != "fake-node"
        assert fault_injection.preflight_delay(0, "n1", env) == 0.0
        assert fault_injection.ignored(env) == sorted(stray)
    on = {**stray, **ON}
    assert TestHooks.from_env(on).active and node_name(on) == "fake-node"
    assert TestHooks.from_env(on).writer_delay(sync=False) == 3.0
    assert TestHooks.from_env(on).writer_delay(sync=True) == 0.0     # background saves only
    assert TestHooks.from_env(on).writer_item_delay() == 0.25
    later = TestHooks.from_env(on)
    later.attempt = 2
    assert later.writer_item_delay() == 0.0                          # the first attempt only
    assert TestHooks.from_env(on).cpu_page_lock()(0, 1) is None       # the stand-in locks
    assert fault_injection.preflight_delay(0, "n1", on) == 600.0 and not fault_injection.ignored(on)
    with pytest.raises(KeyError):                              # only registered names are read
        fault_injection.value("HPCTRAIN_TEST_SOMETHING_ELSE", on)


# ------------------------------------------------------------------------------- flops
class _Model:
    def __init__(self, **kw):
        defaults = dict(num_query_groups=None, kv_channels=None, ffn_hidden_size=None,
                        make_vocab_size_divisible_by=128, max_position_embeddings=None,
                        position_embedding_type="learned_absolute", activation="gelu",
                        add_bias_linear=True, untie_embeddings_and_output_weights=False)
        self.__dict__.update({**defaults, **kw})


def test_flops_equal_megatron_lm_formula_and_gpt3_size():
    gpt3 = _Model(num_layers=96, hidden_size=12288, num_attention_heads=96, vocab_size=50257,
                  seq_length=2048)
    shape = ModelShape.from_model(gpt3)
    assert abs(total_parameters(shape) / 1e9 - 175.0) < 0.5
    b, s, l, h, v = 1536, 2048, 96, 12288, shape.padded_vocab(1)
    # Narayanan et al. 2021, eq. 3 without recomputation: 72·B·s·l·h²·(1 + s/6h + V/12lh),
    # attention over the full square; Megatron-LM 0.16.1 halves it for the causal mask (s/12h)
    paper = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_step_full_attention(shape, b) == pytest.approx(paper, rel=1e-12)
    causal = 72 * b * s * l * h * h * (1 + s / (12 * h) + v / (12 * l * h))
    assert model_flops_per_step(shape, b) == pytest.approx(causal, rel=1e-12)
    assert forward_flops_per_token(shape) * 3 * b * s == model_flops_per_step(shape, b)


def test_flops_gqa_swiglu_and_mfu():
    llama = _Model(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                   ffn_hidden_size=14336, vocab_size=128256, seq_length=8192,
                   position_embedding_type="rope", activation="swiglu", add_bias_linear=False,
                   untie_embeddings_and_output_weights=True)
    assert abs(total_parameters(ModelShape.from_model(llama)) / 1e9 - 8.03) < 0.02   # Llama-3-8B
    assert padded_vocab_size(257, 128, 1) == 384 == padded_vocab_size(257, 128, 8)
    assert padded_vocab_size(257, 64, 3) == 384            # lcm(64, 3) = 192
    assert mfu(1e15, 2.0, 4, 250.0) == pytest.approx(1e15 / 2 / (4 * 250e12))
    assert mfu(1e15, 2.0, 4, None) is None


def test_a_hold_released_after_a_stop_stays_put_a_moment_for_the_stack_dump():
    h = TestHooks.from_env({**ON, "HPCTRAIN_TEST_HOLD_AFTER_STEP": "4,5"})
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s + (40.0 if len(slept) == 2 else 0.0)     # stopped during the second poll
    polls = iter([False, False, True])
    assert h.hold_after(4, lambda: next(polls), sleep, lambda: now[0])
    assert slept[-1] >= 1.0 and len(slept) == 3              # lingered after the stop
    slept.clear()
    polls = iter([False, True])
    assert h.hold_after(5, lambda: next(polls), sleep, lambda: now[0]) and slept == [0.05]
