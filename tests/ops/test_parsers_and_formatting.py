"""Pure pieces of the operations commands: Slurm durations and array/dependency output (real
captured text), tables, durations, the progress bar."""

from __future__ import annotations

from hpctrain.cli.progress import ProgressLine, render_bar
from hpctrain.ops.fmt import format_bytes, format_duration, format_number, format_table
from hpctrain.scheduler.slurm.commands import parse_duration, parse_sacct, parse_squeue
from hpctrain.scheduler.backend import JobState
from tests.conftest import REPO

FIX = REPO / "tests" / "fixtures" / "ops"


def test_array_tasks_are_one_line_each_and_keep_their_ids():
    rows = parse_squeue((FIX / "squeue_array.txt").read_text())
    assert [(r.job_id, r.state, r.reason) for r in rows] == [
        ("14_1", "PENDING", "JobArrayTaskLimit"), ("14_2", "PENDING", "JobArrayTaskLimit"),
        ("14_0", "RUNNING", "None")]
    assert rows[2].nodes == "n1" and parse_duration(rows[2].time_limit) == 300


def test_sacct_array_rows_by_task_id():
    jobs = {r["JobID"]: r for r in parse_sacct((FIX / "sacct_array.txt").read_text())}
    assert jobs["14_0"]["State"] == "COMPLETED" and jobs["14_1"]["State"] == "RUNNING"
    assert JobState("14_1", jobs["14_1"]["State"]).active
    assert not JobState("14_0", jobs["14_0"]["State"]).active
    assert parse_duration(jobs["14_0"]["Elapsed"]) == 20


def test_chained_job_pends_on_dependency_and_durations_parse():
    chained, first = parse_squeue((FIX / "squeue_dep.txt").read_text())
    assert (chained.state, chained.reason) == ("PENDING", "Dependency")
    assert parse_duration(first.time_limit) == 26 * 3600
    assert parse_duration(chained.time_limit) is None          # UNLIMITED
    assert parse_duration(first.time_used) == 2


def test_parse_duration_forms():
    assert parse_duration("0:00") == 0
    assert parse_duration("12:34") == 754
    assert parse_duration("1:02:03") == 3723
    assert parse_duration("00:00:20") == 20
    assert parse_duration("2-00:00:01") == 2 * 86400 + 1
    for bad in ("", "N/A", "INVALID", "Partition_Limit", "1:x", "a-01:00:00"):
        assert parse_duration(bad) is None, bad


def test_table_aligns_columns_and_shows_missing_values_as_dash():
    text = format_table(["#", "JOB", "DECISION"], [[1, "12", "requeue: preempted"],
                                                   [10, None, "stop: training finished"]])
    lines = text.splitlines()
    assert lines == ["#   JOB  DECISION",
                     "1   12   requeue: preempted",
                     "10  -    stop: training finished"]


def test_durations_numbers_and_sizes_read_naturally():
    assert [format_duration(s) for s in (None, 0, 59, 61, 3600 + 120, 86400 + 7200)] == \
        ["-", "0s", "59s", "1m01s", "1h02m", "1d02h"]
    # what a planner fed an absurd table or profile value, or a damaged record, may hold
    assert [format_duration(s) for s in (float("inf"), -float("inf"), float("nan"), 9e99)] == \
        [">1e15s", "->1e15s", "-", ">1e15s"]
    assert [format_number(x) for x in (None, 3, 2.345678, 1.5e-5, 123456.0, 0.0, "nan")] == \
        ["-", "3", "2.346", "1.500e-05", "1.235e+05", "0", "nan"]
    assert [format_bytes(n) for n in (12, 2048, 3 * 2**30)] == ["12 B", "2.0 KiB", "3.0 GiB"]


def test_gpu_hours_read_naturally_and_stay_one_short_cell():
    """A duration edited into a ledger (1e100 s) made a GPU-hours figure of 120 digits, while
    the duration beside it was capped at ``>1e15s``."""
    from hpctrain.ops.fmt import format_gpu_hours
    assert [format_gpu_hours(h) for h in (None, 0.0042, 3.214, 1234.4)] == \
        ["-", "0.0042", "3.21", "1,234"]
    assert [format_gpu_hours(h) for h in (1e100 / 3600 * 8, float("inf"), -1e30, float("nan"))] \
        == [">1e12", ">1e12", "->1e12", "-"]
    assert format_gpu_hours(9.9e11) == "990,000,000,000"


def test_progress_bar_text_and_silence_off_a_terminal(capsys):
    assert render_bar(30, 120, "loss 2.5") == "[#######.....................]  30/120   25%  loss 2.5"
    assert render_bar(None, 120).startswith("[" + "." * 28 + "]  waiting")
    assert render_bar(500, 120).startswith("[" + "#" * 28 + "]  500/120  100%")
    printed = []
    bar = ProgressLine(120, enabled=False, echo=printed.append)
    bar.update(10, "x")
    bar.echo("a log line")
    bar.close()
    assert printed == ["a log line"] and capsys.readouterr().err == ""


def test_progress_bar_is_cleared_around_log_lines():
    import io
    stream, printed = io.StringIO(), []
    bar = ProgressLine(10, enabled=True, echo=printed.append, stream=stream)
    bar.update(5)
    bar.echo("line")
    bar.close()
    out = stream.getvalue()
    assert printed == ["line"]
    assert out.count("\r\x1b[K") == 3 and out.count("5/10") == 2  # drawn, cleared, redrawn, cleared


def test_following_a_log_loses_no_line_and_waits_for_a_line_cut_mid_character(tmp_path):
    from hpctrain.view.follow import Tail, complete_lines
    log = tmp_path / "rank-0.log"
    text = "step 1 on TP2×PP2\nstep 2 on TP2×PP2\n"
    cut = text.encode().index("×".encode()) + 1  # inside the two bytes of the second line's ×
    cut = text.encode().index("×".encode(), cut) + 1
    log.write_bytes(text.encode()[:cut])
    shown, end = complete_lines(log)
    assert shown == ["step 1 on TP2×PP2"] and end == len("step 1 on TP2×PP2\n".encode())
    tail = Tail(log, end)
    assert tail.lines() == []
    with open(log, "ab") as f:
        f.write(text.encode()[cut:] + b"step 3")
    assert tail.lines() == ["step 2 on TP2×PP2"]
    with open(log, "ab") as f:
        f.write(b"\n")
    assert tail.lines() == ["step 3"]


def test_a_followed_line_that_never_ends_is_held_to_its_end(tmp_path, monkeypatch):
    """A rank redrawing a progress bar with carriage returns writes one line for hours: the
    follower keeps only the end of it (``limits.FOLLOWED_LINE_BYTES``) and, when the line
    ends, says how much of its start it let go."""
    from hpctrain import limits
    from hpctrain.view.follow import Tail
    monkeypatch.setattr(limits, "FOLLOWED_LINE_BYTES", 16)
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"first\n")
    tail = Tail(log)
    assert tail.lines() == ["first"]
    for i in range(5):
        with open(log, "ab") as f:
            f.write(b"\rprogress %d/5" % i)
        assert tail.lines() == []
        assert len(tail.partial) <= 16
    with open(log, "ab") as f:
        f.write(b" done\nnext\n")
    written = b"".join(b"\rprogress %d/5" % i for i in range(5))
    held = written[-16:] + b" done"           # the 16 bytes held, and the end of the line
    assert tail.lines() == [f"[{len(written) - 16:,} bytes of this line not shown] "
                            + held.decode().replace("\r", "\\r"), "next"]


def test_followed_progress_drops_a_warning_and_the_source_line_under_it():
    """A torch warning in rank 0's log, as Python's warnings module writes it (the second line is
    the source line, indented), between two progress lines."""
    from hpctrain.view.follow import Rank0Progress
    log = [
        "10:40:36 rank 0: step 24/24 | loss 5.1707",
        "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py:83: "
        "UserWarning: barrier(): using the device under current context.",
        "  return func(*args, **kwargs)",
        "submitit INFO (2026-11-26 10:40:20,725) - Starting with JobEnvironment(job_id=529)",
        "10:40:36 rank 0: checkpoint: saved step 20",
        "    an indented hpctrain line is shown when no warning precedes it",
    ]
    keep = Rank0Progress()
    assert [line for line in log if keep(line)] == [log[0], log[4], log[5]]
