"""`status` and `report` on a run folder written by hand: the attempts table, the checkpoint
line, and a report whose plotted data are the metrics file's."""

from __future__ import annotations

import json

from hpctrain.ops.checkpoints import inspect_checkpoints
from hpctrain.ops.report import build_figure, collect, summarize
from hpctrain.ops.status import format_status, status_data
from hpctrain.scheduler.backend import JobState
from hpctrain.view.runview import RunView
from tests.conftest import hpctrain
from tests.ops.helpers import crafted_run, png_size, record

LEDGER = [record(1, 0, 12, "preempted", True, saved=12, why="preempted; requeue 1 of 5"),
          record(2, 12, 30, "finished", False, saved=30, loaded=12, why="training finished")]
# attempt 2 resumed from step 12 but metrics of steps 11-12 were written twice (the first
# attempt wrote them before its emergency save): the later record of a step is the one plotted
METRICS = ([{"step": s, "loss": 5.0 - s / 10, "tokens_per_s": 1000.0 + s, "mfu": 0.3} for s in range(1, 13)]
           + [{"step": s, "loss": 4.0 - s / 20, "tokens_per_s": 900.0 + s, "mfu": 0.31} for s in range(11, 31)])


def finished_run(tmp_path):
    return crafted_run(tmp_path, ledger=LEDGER, metrics=METRICS, checkpoints=[10, 12, 30])


def test_status_shows_both_attempts_and_the_newest_checkpoint(tmp_path):
    run = finished_run(tmp_path)
    view = RunView(run=run, meta=run.meta(), jobs=[JobState("41", "COMPLETED", nodes="n[1-2]")],
                   ledger=run.ledger(), events=run.events(), last_metric=METRICS[-1])
    data = status_data(view, inspect_checkpoints(run))
    assert (data["state"], data["step"], data["total_steps"], data["loss"]) == ("FINISHED", 30, 30, 2.5)
    assert data["checkpoint"]["step"] == 30 and data["checkpoint"]["complete"]
    text = format_status(data)
    lines = text.splitlines()
    assert f"Run         {run.id}  (dev-slurm, TP1×PP1×DP2, 2 ranks)" in lines
    assert "Progress    step 30 / 30 (100%), loss 2.5, 930 tokens/s, MFU 31.0%" in lines
    assert any(ln.startswith("Checkpoint  step 30, ") and ln.endswith("step-00000030") for ln in lines)
    table = lines[lines.index("Attempts") + 1:]
    assert table[0].split() == ["#", "JOB", "RESTART", "NODES", "STEPS", "EXIT", "LOADED", "SAVED",
                                "DURATION", "DECISION"]
    assert table[1].split() == ["1", "41", "0", "n1,n2", "0→12", "preempted", "(75)", "-", "step",
                                "12", "1m05s", "requeue:", "preempted;", "requeue", "1", "of", "5"]
    assert table[2].split()[:9] == ["2", "41", "1", "n1,n2", "12→30", "finished", "step", "12", "step"]
    json.dumps(data)  # --json prints exactly this


def test_report_figure_plots_the_metrics_and_marks_preemption_and_checkpoints(tmp_path):
    run = finished_run(tmp_path)
    data = collect(run)
    fig = build_figure(data)
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid()}
    by_step = {m["step"]: m for m in METRICS}  # the last record of each step
    steps = sorted(by_step)
    assert list(lines["loss"].get_xdata()) == steps
    assert list(lines["loss"].get_ydata()) == [by_step[s]["loss"] for s in steps]
    assert list(lines["tokens_per_s"].get_ydata()) == [by_step[s]["tokens_per_s"] for s in steps]
    assert list(lines["mfu"].get_ydata()) == [by_step[s]["mfu"] for s in steps]
    assert list(lines["preempted-1"].get_xdata()) == [12, 12]
    assert list(lines["resumed-2"].get_xdata()) == [12, 12]
    assert list(lines["checkpoints"].get_xdata()) == [10, 12, 30]
    assert fig.get_size_inches().tolist() == [12.0, 9.0] and fig.dpi == 100
    s = summarize(data)
    assert (s["attempts"], s["preemptions"], s["requeues"], s["last_loss"]) == (2, 1, 1, 2.5)
    assert s["min_loss_step"] == 30 and s["checkpoints"] == [10, 12, 30]


def test_report_without_mfu_says_so_and_still_draws(tmp_path):
    run = crafted_run(tmp_path, metrics=[{"step": 1, "loss": 3.0, "tokens_per_s": 10.0, "mfu": None}])
    fig = build_figure(collect(run))
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(t.startswith("no MFU recorded") for t in texts)
    assert "mfu" not in {ln.get_gid() for ax in fig.axes for ln in ax.get_lines()}


def test_report_command_writes_a_png_of_the_asked_size(tmp_path):
    run = finished_run(tmp_path)
    proc = hpctrain("report", str(run.path), check=True)
    png = run.path / "report.png"
    assert proc.stdout.splitlines()[0] == f"Report: {png} (1200×900)"
    assert "Attempts    2 (1 preempted, 1 requeued)" in proc.stdout
    assert "Checkpoints 3 (steps 10, 12, 30)" in proc.stdout
    assert png_size(png) == (1200, 900)
    out = tmp_path / "small.png"
    proc = hpctrain("report", str(run.path), "-o", str(out), "--size", "640x480", "--json", check=True)
    assert json.loads(proc.stdout)["report"] == str(out) and png_size(out) == (640, 480)
    bad = hpctrain("report", str(run.path), "--size", "big")
    assert bad.returncode == 2 and "--size 'big': expected WIDTHxHEIGHT" in bad.stderr


def test_status_says_which_straggler_node_a_requeue_kept_in_and_why(tmp_path):
    why = "not excluding n2: the partition debug would have 1 usable node and the job needs 2"
    slow = {**record(1, 0, 4, "straggler", True, saved=4, why="straggler; requeue 1 of 5"),
            "excluded_nodes": [], "not_excluded_nodes": ["n2"], "exclusion_note": why}
    event = {"event": "straggler", "node": "n2", "ranks": [1], "ratio": 2.0, "intervals": 2,
             "step": 4, "attempt": 1}
    run = crafted_run(tmp_path, ledger=[slow], events=[event])
    view = RunView(run=run, meta=run.meta(), jobs=[JobState("41", "PENDING")],
                   ledger=run.ledger(), events=run.events(), last_metric=None)
    data = status_data(view, inspect_checkpoints(run))
    (row,) = data["stragglers"]
    assert row["excluded_after_attempt"] is None and row["not_excluded_after_attempt"] == 1
    assert data["attempts"][0]["not_excluded_nodes"] == ["n2"]
    lines = format_status(data).splitlines()
    assert any(ln.startswith("Stragglers  n2: rank 1 at 2× ") and
               ln.endswith("; kept in after attempt 1") for ln in lines), lines
    assert f"  attempt 1: {why}" in lines


def test_validation_loss_in_status_and_in_the_report_next_to_the_training_curve(tmp_path):
    valid = [{"kind": "validation", "step": s, "loss": 4.5 - s / 30, "iters": 2, "attempt": 1}
             for s in (10, 20, 30)]
    test = [{"kind": "test", "step": 30, "loss": 3.3, "iters": 2, "attempt": 2}]
    metrics = METRICS[:12] + valid[:1] + METRICS[12:22] + valid[1:] + METRICS[22:] + test
    run = crafted_run(tmp_path, ledger=LEDGER, metrics=metrics, checkpoints=[10, 12, 30])
    assert run.metrics() == METRICS and run.metrics(kind="validation") == valid
    data = collect(run)
    fig = build_figure(data)
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines() if ln.get_gid()}
    assert list(lines["validation_loss"].get_xdata()) == [10, 20, 30]
    assert list(lines["validation_loss"].get_ydata()) == [v["loss"] for v in valid]
    assert list(lines["test_loss"].get_ydata()) == [3.3]
    assert lines["validation_loss"].axes is lines["loss"].axes      # one panel, two curves
    assert list(lines["loss"].get_xdata()) == sorted({m["step"] for m in METRICS})
    s = summarize(data)
    assert (s["last_validation_loss"], s["last_validation_step"], s["test_loss"]) == \
        (valid[-1]["loss"], 30, 3.3)
    view = RunView(run=run, meta=run.meta(), jobs=[JobState("41", "COMPLETED")],
                   ledger=run.ledger(), events=run.events(), last_metric=run.latest_metrics(),
                   last_validation=run.latest_metrics("validation"))
    status = status_data(view, inspect_checkpoints(run))
    assert status["loss"] == 2.5 and status["validation_loss"] == valid[-1]["loss"]
    assert "Validation  loss 3.5 at step 30" in format_status(status).splitlines()


def test_report_and_trackers_show_each_in_job_restart(tmp_path):
    """The report names, for each restart inside the job, the node left out and why, the
    spare that took its place and what the recovery cost: from the ledger once the attempt
    ended, from rank 0's event while it still trains; the trackers get that event."""
    from hpctrain.ops.report import format_summary
    from hpctrain.record.attempt_end import in_job_restart_event, write_restart
    from hpctrain.tracking.records import describe_event, shown_events
    failed = {**record(1, 0, 10, "failed", False, why="restart in the allocation"),
              "first_failure": {"rank": 1, "node": "n2", "time": 1050.0}}
    failed["decision"]["in_job"] = True
    restarted = {**record(2, 8, 14, "failed", True), "restart_count": 0, "nodes": ["n1", "n3"],
                 "first_failure": {"rank": 0, "node": "n1", "time": 3050.0},
                 "in_job_restart": {"after_attempt": 1, "excluded": ["n2"], "spares": ["n3"],
                                    "why": "rank 1 failed first: Killed", "in_place": False,
                                    "recovery_s": 21.5, "steps_lost": 2}}
    run = crafted_run(tmp_path, ledger=[failed, restarted],
                      metrics=[{"step": s, "loss": 3.0 - s / 10} for s in range(1, 15)])
    # attempt 3 restarts again (in place) and trains: its rank 0 writes the event
    write_restart(run, 3, {"after_attempt": 2, "failed_at": 3050.0, "excluded": [],
                           "spares": [], "why": "rank 0 failed first: Killed",
                           "in_place": True, "nodes": ["n1", "n3"]})
    event = in_job_restart_event(run, 3, first_step_at=3071.0, start_step=8)
    assert (event["recovery_s"], event["steps_lost"]) == (21.0, 6), event
    assert in_job_restart_event(run, 2, first_step_at=1.0, start_step=8) is None  # no restart.json
    data = collect(run)
    text = format_summary(summarize(data))
    assert ("Restart     attempt 2 after 1: n2 -> n3 (rank 1 failed first: Killed); 22s "
            "from the failure to the first step, 2 steps redone") in text, text
    assert "attempt 3 after 2: in place on n1, n3 (rank 0 failed first: Killed)" in text, text
    assert "6 steps redone" in text, text
    lines = {ln.get_gid() for ax in build_figure(data).axes for ln in ax.get_lines()}
    assert "in-job-restart-2" in lines
    shown = [(label, e) for label, e in shown_events(run.events())]
    assert [label for label, _ in shown] == ["in-place-restart"]
    assert '"steps_lost": 6' in describe_event(shown[0][1])


def test_node_names_and_restart_fields_from_the_records_are_printed_escaped(tmp_path):
    """A straggler's node name in ``metrics.jsonl`` went to the report's text raw: an escape
    code there retitled and cleared the terminal (``status`` escaped the same kind of value).
    Each node name and restart field from a record is printed in the one printable form
    (``file_door.show``), whatever its type, and a restart without ``after_attempt`` does not
    say "after None"."""
    from hpctrain.ops.report import format_summary
    from hpctrain.ops.status import restart_line
    hostile = "n1\x1b]0;PWNED\x07\x1b[2J"
    restarted = {**record(1, 0, 4, "failed", True),
                 "in_job_restart": {"excluded": [hostile, "n7"], "spares": ["n3\u202e", "n4"],
                                    "why": "a\x1b[31mb", "in_place": False}}
    run = crafted_run(tmp_path, ledger=[restarted],
                      metrics=[{"step": 1, "loss": 2.0, "stragglers": [{"node": hostile}]}])
    data = collect(run)
    text = format_summary(summarize(data))
    line = restart_line({"attempt": 1, **restarted})
    for out in (text, line):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, out
        assert "None" not in out.replace("'None'", ""), out
    assert "n1\\x1b]0;PWNED\\x07\\x1b[2J' (named at step 1)" in text, text
    assert "Restart     attempt 1: " in text and "'n3\\u202e', n7 -> n4" in text, text
    assert line.startswith("  attempt 1: restarted inside the job: "), line
    build_figure(data)                                  # the figure's labels are the same names
