"""The training loop's decisions across the ranks and attempts of one run (``runtime.loop``),
on a real megatron-core model over four ranks (PP2 × DP2, the distributed optimizer), from
``loop_probe.py``: one launch for every attempt, where a training run per story would take
minutes.

The stories: a preemption signal that reaches one rank stops every rank after the same step
with an emergency checkpoint; a time limit that only rank 0's clock sees stops every rank in
the evaluation under way, saved; a signal in an evaluation right after a resume stops without
saving again (the checkpoint just loaded holds the step), and the next attempt evaluates that
step first; a signal in the evaluation after a trained step saves it; a run resumed with
nothing left to train only evaluates; through all of it, the interrupted run trains bit for
bit as the uninterrupted one and reports the same losses. NaN losses skip the update on every
rank until the guard stops the run."""

from __future__ import annotations

import json

import pytest

from tests.conftest import token_corpus
from tests.runtime.helpers import job_mapping, make_run

pytestmark = pytest.mark.megatron
WORLD = 4
GBS = 8
STEPS = 6
# (run, attempt) -> what every rank's attempt must end with: exit reason, first and last
# step, the checkpoint it saved at the end, the saves it made (step, reason, synchronous),
# the optimizer updates so far, the last steps validated and tested
EXPECTED = {
    ("whole", 1): ("finished", 0, 6, "step-00000006",
                   [(2, "periodic", False), (4, "periodic", False), (6, "final", True)],
                   6, 6, 6),
    # the signal on rank 3 at the start of step 3: step 3 is trained, saved, the attempt ends
    ("stopped", 1): ("preempted", 0, 3, "step-00000003",
                     [(2, "periodic", False), (3, "emergency", True)], 3, 2, None),
    # step 4 trained; rank 0's time limit near in the validation after it: saved, no
    # validation recorded (the next attempt does it again), no periodic save of step 4
    ("stopped", 2): ("deadline", 3, 4, "step-00000004", [(4, "deadline", True)], 4, 2, None),
    # the validation of step 4 again, the signal in it: the checkpoint loaded holds step 4
    ("stopped", 3): ("preempted", 4, 4, None, [], 4, 2, None),
    # validation of step 4 done, steps 5 and 6, the signal in the validation after step 6
    ("stopped", 4): ("preempted", 4, 6, "step-00000006", [(6, "emergency", True)], 6, 4, None),
    # nothing to train: the validation of step 6, the signal in the test
    ("stopped", 5): ("preempted", 6, 6, None, [], 6, 6, None),
    ("stopped", 6): ("finished", 6, 6, None, [], 6, 6, 6),
    # NaN losses at steps 2 and 3, max_skipped_steps 2: no update after step 1
    ("unstable", 1): ("unstable", 0, 3, None, [(2, "periodic", False)], 1, 2, None),
    # "whole" without gradient clipping, evaluations or saves
    ("unclipped", 1): ("finished", 0, 6, None, [], 6, None, None),
}
CODES = {"finished": 0, "preempted": 75, "deadline": 75, "unstable": 3}


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict:
    from tests.launch import Launch
    from tests.runtime.conftest import _explain
    tmp = tmp_path_factory.mktemp("loop")
    # 200 documents of 23 tokens: validation and test splits of a few global batches each
    prefix = token_corpus(tmp / "corpus", 200, 23, stride=7, doc_shift=11, vocab=251)

    def job(checkpoint=None, **train) -> dict:
        return job_mapping(
            prefix, "pp2dp2_zero1", steps=STEPS,
            batch={"micro_batch_size": 2, "global_batch_size": GBS},
            train={"eval_interval": 2, "eval_iters": 2, "eval_at_end": True, **train},
            data={"split": "80,10,10"},
            checkpoint=checkpoint or {"interval_steps": 2, "async_save": True, "keep_last": 10})
    runs = {name: make_run(tmp / "runs", name, job(**train), WORLD) for name, train in (
        ("whole", {}), ("stopped", {}), ("unstable", {"stability": {"max_skipped_steps": 2}}),
        ("unclipped", {"clip_grad": 0.0, "eval_interval": None, "eval_at_end": False,
                       "profile_step": 2, "checkpoint": {"save_at_end": False}}))}
    out = tmp / "out"
    out.mkdir()
    res = Launch(runs["whole"].path, WORLD, module="tests.runtime.loop_probe",
                 args=[str(runs[n].path) for n in ("whole", "stopped", "unstable", "unclipped")]
                 + [str(out)]).wait(900)
    assert res.ok, _explain(res)
    seen = {key: [json.loads((out / f"{key[0]}-attempt-{key[1]}-rank-{r}.json").read_text())
                  for r in range(WORLD)] for key in EXPECTED}
    return {"seen": seen, "runs": runs, "log": [res.output(r).splitlines() for r in range(WORLD)]}


def _stage_and_dp(rank: int) -> tuple[int, int]:
    """PP2 × DP2 on four ranks, megatron's order (TP, DP, PP from fastest): rank r is stage
    r // 2, DP rank r % 2."""
    return rank // 2, rank % 2


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[0]}-{k[1]}")
def test_every_rank_ends_the_attempt_as_the_story_says(probed, key):
    reason, start, end, saved, saves, updates, validated, tested = EXPECTED[key]
    for seen in probed["seen"][key]:
        out = seen["outcome"]
        assert (out["exit_reason"], out["exit_code"], out["start_step"], out["end_step"],
                out["checkpoint_saved"]) == (reason, CODES[reason], start, end, saved), seen
        assert [tuple(s.values()) for s in seen["saves"]] == saves, seen["saves"]
        assert (seen["updates"], seen["evaluated_step"], seen["tested_step"]) == \
            (updates, validated, tested)
        assert seen["step"] == end and seen["consumed"] == end * GBS
        # the common state a save of this step would hold
        common = seen["common"]
        assert (common["step"], common["consumed_samples"], common["optimizer_updates"],
                common["evaluated_step"], common["tested_step"]) == \
            (end, end * GBS, updates, validated, tested)


def test_each_attempt_resumes_from_what_the_last_one_published(probed):
    seen = probed["seen"]
    published = None
    for attempt in range(1, 7):
        ranks = seen[("stopped", attempt)]
        assert {s["loaded"] for s in ranks} == {published}, attempt
        published = ranks[0]["published"]
        assert {s["published"] for s in ranks} == {published}
    assert seen[("whole", 1)][0]["loaded"] is None
    # what the position means is saved with it, in the common state and the manifest
    from hpctrain.data.fingerprint import data_fingerprint
    from hpctrain.data.order import FEISTEL
    from hpctrain.record import checkpoint_store as store
    run = probed["runs"]["stopped"]
    recorded = data_fingerprint(run.resolved_job(), FEISTEL)
    assert {json.dumps(s["common"]["data"]) for s in seen[("stopped", 6)]} == \
        {json.dumps(recorded)}
    assert store.read_manifest(run.checkpoint_dir() / "step-00000006")["data"] == recorded


def test_the_interrupted_run_trains_bit_for_bit_as_the_uninterrupted_one(probed):
    """Every rank's weights after every step, and at the end, are the uninterrupted run's,
    whichever attempt trained the step."""
    seen = probed["seen"]
    for rank in range(WORLD):
        whole = seen[("whole", 1)][rank]
        steps = {}
        for attempt in range(1, 7):
            for step, digest, _ in seen[("stopped", attempt)][rank]["after_step"]:
                assert step not in steps, (rank, step, "trained twice")
                steps[step] = digest
        assert steps == {step: digest for step, digest, _ in whole["after_step"]}, rank
        assert len(steps) == STEPS
        assert seen[("stopped", 6)][rank]["final_weights"] == whole["final_weights"]


def test_the_replicas_hold_the_same_weights_when_an_attempt_ends(probed):
    """The distributed optimizer updates a shard per DP rank; by the end of the attempt every
    replica has gathered the others' (and each stage its own weights)."""
    for key, ranks in probed["seen"].items():
        by_stage: dict = {}
        for seen in ranks:
            stage, _ = _stage_and_dp(seen["rank"])
            by_stage.setdefault(stage, set()).add(seen["final_weights"])
        assert all(len(d) == 1 for d in by_stage.values()), key
        assert len(set().union(*by_stage.values())) == 2, key


def test_the_run_reports_the_same_losses_as_the_uninterrupted_one(probed):
    """metrics.jsonl: each step's training loss, the validations after steps 2, 4 and 6 and
    the test at the end, as the uninterrupted run reports them; a validation cut short is
    not recorded (the next attempt records it)."""
    whole, stopped = probed["runs"]["whole"], probed["runs"]["stopped"]

    def by_step(run, kind):
        return [(r["step"], r["loss"], r["attempt"]) for r in run.metrics(kind=kind)]
    assert [(s, x) for s, x, _ in by_step(stopped, "train")] == \
        [(s, x) for s, x, _ in by_step(whole, "train")]
    assert [s for s, _, _ in by_step(whole, "train")] == list(range(1, STEPS + 1))
    assert [a for _, _, a in by_step(stopped, "train")] == [1, 1, 1, 2, 4, 4]
    want = {s: x for s, x, _ in by_step(whole, "validation")}
    assert sorted(want) == [2, 4, 6]
    got = by_step(stopped, "validation")
    assert [(s, a) for s, _, a in got] == [(2, 1), (4, 4), (6, 5), (6, 6)]
    assert all(x == want[s] for s, x, _ in got)
    assert [(s, x) for s, x, _ in by_step(stopped, "test")] == \
        [(s, x) for s, x, _ in by_step(whole, "test")]
    assert [(s, a) for s, _, a in by_step(stopped, "test")] == [(6, 6)]


def test_the_signal_is_named_on_the_rank_it_reached(probed):
    seen = probed["seen"]
    for attempt, rank, during in ((1, 3, ""), (3, 1, " during evaluation"),
                                  (4, 1, " during evaluation"), (5, 2, " during evaluation")):
        for s in seen[("stopped", attempt)]:
            here = s["rank"] == rank
            assert s["signal"] == ("SIGUSR1" if here else None), (attempt, s["rank"])
            cause = "signal SIGUSR1" if here else "signal on another rank"
            assert s["outcome"]["message"].startswith(cause + during), s["outcome"]["message"]
    # a signal in the evaluation right after a resume: nothing new to save
    for attempt, step in ((3, 4), (5, 6)):
        for s in seen[("stopped", attempt)]:
            assert s["outcome"]["message"].endswith(
                f"during evaluation: step {step} already in the checkpoint this attempt "
                f"resumed from, exiting to be requeued")
    assert seen[("stopped", 4)][0]["outcome"]["message"].endswith(
        "during evaluation: step 6 saved, exiting to be requeued")
    for s in seen[("stopped", 2)]:
        assert s["signal"] is None
        assert s["outcome"]["message"].startswith(
            "the job's time limit is near during evaluation: step 4 saved")


def test_a_wall_clock_stepped_back_moves_no_duration(probed):
    """The whole run's wall clocks went an hour back at step 4's start and in the first batch
    of the second validation, on every rank, as an NTP correction does. Every step time and
    evaluation time stays the short positive duration it was (the watchdog's, below, too):
    a negative one would shrink the reserve the time limit is judged by, and show a
    negative throughput."""
    from tests.runtime.loop_probe import CLOCK_STEP_S
    records = probed["runs"]["whole"].metrics(kind=None)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] != "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert all(0 < r["step_time_s"] < CLOCK_STEP_S and r["tokens_per_s"] > 0 for r in train)
    assert [(r["kind"], r["step"]) for r in evals] == [
        ("validation", 2), ("validation", 4), ("validation", 6), ("test", 6)]
    assert all(0 <= r["seconds"] < CLOCK_STEP_S for r in evals), evals
    # the clock did go back, twice: the records' epoch seconds say so
    times = [r["time"] for r in records]
    assert sum(b < a - CLOCK_STEP_S / 2 for a, b in zip(times, times[1:])) == 2, times


def test_the_watchdog_hears_every_step_and_every_evaluation(probed):
    for key, ranks in probed["seen"].items():
        for seen in ranks:
            heard = seen["heard"]
            done = [c[1] for c in heard if c[0] == "step_done"]
            trained = [step for step, _, _ in seen["after_step"]]
            assert done == trained, (key, seen["rank"])
            assert all(c[2] for c in heard if c[0] == "step_done")
            batches = [c[2] for c in heard if c[0] == "progress" and "batch" in (c[2] or "")]
            # every evaluation begun is heard batch by batch
            assert all(b.split(" batch ")[0] in ("validation", "test") for b in batches)
    # a finished evaluation is progress at its step: the last attempt's two
    last = probed["seen"][("stopped", 6)][0]["heard"]
    assert [c for c in last if c[0] == "progress" and c[1] is not None] == \
        [["progress", 6, "step"]]
    kinds = [c[2] for c in last if c[0] == "progress" and c[2] and "batch" in c[2]]
    assert kinds == ["validation batch 1/2", "validation batch 2/2", "test batch 1/2",
                     "test batch 2/2"]


def test_nan_losses_skip_the_update_on_every_rank_until_the_guard_stops(probed):
    ranks = probed["seen"][("unstable", 1)]
    run = probed["runs"]["unstable"]
    for seen in ranks:
        digests = {step: digest for step, digest, _ in seen["after_step"]}
        # no update at steps 2 and 3 (what a rank holds after step 2 is step 1's gathered)
        assert digests[2] == digests[3] and digests[1] != digests[2]
        assert seen["skipped_total"] == 2 and seen["common"]["guard"]["skipped_in_a_row"] == 2
        assert seen["outcome"]["message"].startswith("2 updates in a row were skipped")
    skipped = [(e["step"], e["reason"], e["attempt"]) for e in run.events()
               if e.get("event") == "step_skipped"]
    assert skipped == [(2, "loss is nan", 1), (3, "loss is nan", 1)]
    rows = [(r["step"], r["skipped"], r["skip_reason"]) for r in run.metrics()]
    assert rows == [(1, False, None), (2, True, "loss is nan"), (3, True, "loss is nan")]


def test_the_gradient_is_clipped_to_the_jobs_norm(probed):
    """train.clip_grad 1.0 against 0 (off) from the same weights and batches: the first
    step's gradient norm is the same and above 1, and from the second step on the clipped
    run's weights part from the unclipped run's (Adam's update follows the ratio of its
    moments, which clipping each step by another factor changes)."""
    whole, unclipped = probed["runs"]["whole"], probed["runs"]["unclipped"]
    first = [r["grad_norm"] for r in whole.metrics()][0]
    assert first == unclipped.metrics()[0]["grad_norm"] and first > 1.0
    for rank in range(WORLD):
        clipped = {s: d for s, d, _ in probed["seen"][("whole", 1)][rank]["after_step"]}
        free = {s: d for s, d, _ in probed["seen"][("unclipped", 1)][rank]["after_step"]}
        assert all(clipped[step] != free[step] for step in range(2, STEPS + 1)), rank


def test_every_logged_step_gathers_the_ranks_forward_times(probed):
    """The straggler watch: at every logged step (log_interval 1) the forward passes' times of
    every rank are gathered; the metrics say which nodes were slow (none here) and the
    median and slowest rank's compute time."""
    for name in ("whole", "stopped", "unstable"):
        for row in probed["runs"][name].metrics():
            assert row["stragglers"] == [], (name, row)
            assert 0 < row["compute_s_median"] <= row["compute_s_max"], (name, row)


def test_rank_0_says_whether_a_stopped_evaluation_saves(probed):
    """What rank 0 logs when an evaluation is stopped: an emergency checkpoint after a trained
    step, none right after a resume (the loaded checkpoint holds the step); no other rank
    says it."""
    said = [line.split(": ", 1)[1] for line in probed["log"][0] if "during evaluation;" in line]
    assert said == [
        "step 4: the job's time limit is near during evaluation; saving an emergency checkpoint",
        "step 4: signal on another rank during evaluation; the loaded checkpoint holds this step",
        "step 6: signal on another rank during evaluation; saving an emergency checkpoint",
        "step 6: signal on another rank during evaluation; the loaded checkpoint holds this step",
    ], said
    assert not any("during evaluation;" in line for log in probed["log"][1:] for line in log)


def test_the_last_evaluation_batch_leaves_time_for_the_next_training_step(probed):
    """The evaluator asks rank 0's clock after each batch whether the next one leaves time for
    a save; after the last batch the next work is a training step, so the trainer's answer
    reserves that step, as a step's own agreement does: with half a step more than a save
    needs, a batch of no time still fits, the training step does not (the stopped run's
    second attempt, near its time limit)."""
    answers = probed["seen"][("stopped", 2)][0]["after_evaluation"]
    assert answers["step_time"] > 0
    assert (answers["next_batch_0"], answers["last_batch"]) == (False, True)
    # a stop waits for the background save in flight: what it may still take is reserved too
    assert (answers["no_save_in_flight"], answers["save_in_flight"]) == (False, True)


def test_a_resumed_attempt_reserves_its_checkpoints_step_time_from_its_first_step(probed):
    """The deadline keeps one step in reserve after each step; the first attempt knows no step
    time before its first step, a resumed one starts from the smoothed step time its
    checkpoint recorded (its own first step, the slowest, is then not followed unreserved)."""
    for seen in probed["seen"][("whole", 1)]:
        assert seen["loaded_step_time"] is None and seen["step_time_at_start"] is None
        assert seen["common"]["step_time_s"] > 0
    resumed = [seen for key, ranks in probed["seen"].items() if key[0] == "stopped" and key[1] > 1
               for seen in ranks]
    assert resumed
    for seen in resumed:
        assert seen["loaded_step_time"] > 0
        assert seen["step_time_at_start"] == seen["loaded_step_time"]


def test_every_rank_saves_the_same_common_state(probed):
    """megatron-core compares the ranks' common states at a save and warns of every key that
    differs (a rank's own step time did); the trainer saves rank 0's on every rank."""
    for log in probed["log"]:
        assert not [line for line in log if "Mismatched keys" in line or
                    "Keys only on rank" in line], log


def test_the_profiled_step_says_when_its_passes_were_issued(probed):
    """train.profile_step 2 (the unclipped run): every rank's summary of step 2, the host
    having issued its forward and backward passes within the step's time, which is within
    rank 0's step time in the metrics (measured on rank 0 from the same start, after the
    summary)."""
    run = probed["runs"]["unclipped"]
    (step_2,) = [r["step_time_s"] for r in run.metrics() if r["step"] == 2]
    for rank in range(WORLD):
        report = json.loads((run.attempt_dir(1) / f"profile-step-2-rank-{rank}.json")
                            .read_text())
        assert 0 < report["issued_s"] <= report["step_s"], (rank, report)
        if rank == 0:
            assert report["step_s"] <= step_2 + 1e-4, report   # both rounded to 4 decimals


def test_the_loss_logged_is_the_mean_of_the_replicas_losses(probed):
    """Each step's loss in metrics.jsonl is the mean of what the two reporting ranks (the last
    stage's TP rank 0 in each DP replica: ranks 2 and 3) computed; the other ranks report
    nothing."""
    import math
    for (name, attempt), ranks in probed["seen"].items():
        logged = {r["step"]: r["loss"] for r in probed["runs"][name].metrics()
                  if r["attempt"] == attempt}
        local = [{step: loss for step, _, loss in seen["after_step"]} for seen in ranks]
        assert all(loss is None for r in (0, 1) for loss in local[r].values())
        for step, loss in logged.items():
            a, b = local[2][step], local[3][step]
            assert a != b or math.isnan(a), (name, step)     # two replicas, two batches
            mean, loss = (a + b) / 2, float(loss)      # a NaN is written as "nan"
            assert loss == mean or (math.isnan(loss) and math.isnan(mean)), \
                (name, attempt, step, loss, a, b)
