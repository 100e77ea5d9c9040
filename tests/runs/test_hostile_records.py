"""Records that parse but hold hostile values (a node name that is a number, a loss of 1e308,
a negative step, a NUL in a checkpoint file's name, NaN, a sweep that is a list): the
run-folder reader's type checks (``hpctrain.record.reader``) refuse them at the one door, so
``hpctrain status`` and ``hpctrain report`` answer with the run's state or one ``Error:`` line
naming the file and the line (exit 2), never a traceback nor an internal error, and nothing on
disk changes.

The run folders are real ones (``hpctrain submit --dry-run`` on the local profile), copied for
each example; one file is then replaced by valid JSON records with hostile field values.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from hpctrain import limits
from hpctrain.cli import cli
from hpctrain.record import reader
from tests.conftest import REPO

TINY = str(REPO / "examples" / "tiny.yaml")
EXAMPLES = int(os.environ.get("HPCTRAIN_HYPOTHESIS_EXAMPLES", "40"))
MANIFEST = "checkpoints/step-00000010/manifest.json"


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One real run folder (a dry run of the tiny job on the local profile)."""
    root = tmp_path_factory.mktemp("hostile-template") / "runs"
    result = CliRunner().invoke(cli, ["submit", TINY, "--dry-run"],
                                env={"HPCTRAIN_RUNS_DIR": str(root)})
    assert result.exit_code == 0, result.output
    (run_id,) = [p.name for p in root.iterdir() if (p / "run.yaml").is_file()]
    return root, run_id


def _copy(template, base: Path) -> tuple[Path, str]:
    """A copy of the template's runs folder under ``base``, its run.yaml naming the copy's
    checkpoint folder (the template's names its own)."""
    src, run_id = template
    root = base / "runs"
    shutil.copytree(src, root, symlinks=True)
    run_yaml = root / run_id / "run.yaml"
    run_yaml.write_text(run_yaml.read_text().replace(str(src), str(root)))
    return root, run_id


def _manifest(run_id: str, **fields) -> dict:
    return {"format": "hpctrain-checkpoint", "format_version": 2, "step": 10,
            "created": "2026-01-01T00:00:00+0000", "run": run_id, "total_bytes": 3,
            "files": {"state.json": {"size": 3, "crc32c": "00000000"}}, **fields}


def _write(root: Path, run_id: str, target: str, lines: list) -> Path:
    path = root / run_id / target
    path.parent.mkdir(parents=True, exist_ok=True)
    if target == MANIFEST:
        (path.parent / "state.json").write_text("abc")
    if target == "run.yaml":          # the run's own fields, some replaced
        import yaml
        from hpctrain.config import yamlio
        meta = yamlio.parse_mapping(path.read_text(), "run.yaml")
        path.write_text(yaml.safe_dump({**meta, **lines[0]}, sort_keys=False))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath, name)
            out[str(p)] = p.read_bytes()
    return out


def _answers(result, argv) -> None:
    """Exit 0, or exit 2 with one ``Error:`` line; never a traceback nor an internal error."""
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        (argv, result.output, result.exc_info)
    assert "internal error" not in result.output and "Traceback" not in result.output, \
        (argv, result.output)
    assert result.exit_code in (0, 2), (argv, result.exit_code, result.output)
    if result.exit_code == 2:
        errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, (argv, result.output)


def _run(root: Path, argv: list[str]):
    return CliRunner().invoke(cli, argv, env={"HPCTRAIN_RUNS_DIR": str(root),
                                              "HPCTRAIN_DEBUG": ""})


# ---- the audit's findings, one by one ----------------------------------------------------------

FINDINGS = [
    ("ledger.jsonl", {"attempt": 1, "nodes": [1, 2]}, "nodes[0]"),
    ("metrics.jsonl", {"step": 1, "loss": "inf", "tokens_per_s": "x", "mfu": [1]}, "tokens_per_s"),
    ("metrics.jsonl", {"step": -1, "loss": 1e308, "tokens_per_s": 1e308, "mfu": 1e308}, "step"),
    ("metrics.jsonl", {"step": 1, "loss": 1e308}, "loss"),
    ("metrics.jsonl", {"step": 1, "loss": 2.0, "mfu": [1]}, "mfu"),
    ("metrics.jsonl", {"step": 1, "stragglers": [{"node": None}, {"node": "a"}]},
     "stragglers[0].node"),
    ("run.yaml", {"sweep": [1]}, "sweep"),
    ("run.yaml", {"sweep": {"id": "s", "values": [1]}}, "sweep.values"),
    ("run.yaml", {"checkpoint_dir": "/tmp/a\x00b"}, "checkpoint_dir"),
    ("run.yaml", {"jobs": None}, "jobs"),
    ("ledger.jsonl", {"attempt": 1, "excluded_nodes": [[1]], "exit_reason": "straggler"},
     "excluded_nodes[0]"),
    ("ledger.jsonl", {"attempt": 1, "in_job_restart": {"excluded": 5}}, "in_job_restart.excluded"),
    ("ledger.jsonl", {"attempt": 1, "exclusion_note": ["x"]}, "exclusion_note"),
    ("ledger.jsonl", {"attempt": 1, "duration_s": 1e308, "last_loss": 10 ** 30}, "duration_s"),
    ("events.jsonl", {"event": "straggler", "node": ["n1"], "ranks": 5}, "node"),
    ("events.jsonl", {"event": "attempt_start", "attempt": 2, "nodes": [1]}, "nodes[0]"),
    ("ledger.jsonl", {"attempt": 1, "exit_reason": "\ud800"}, "line 1"),   # not text
    ("run.yaml", {"sweep": {"id": "s", "values": {"lr": "\udfff"}}}, "surrogate"),
]


@pytest.mark.parametrize("target, record, field", FINDINGS)
def test_a_hostile_record_is_one_error_line_naming_the_file_and_field(template, tmp_path,
                                                                      target, record, field):
    root, run_id = _copy(template, tmp_path)
    _write(root, run_id, target, [record])
    before = _snapshot(root)
    for argv in (["status", run_id], ["status", run_id, "--json"],
                 ["report", run_id, "-o", str(tmp_path / "r.png")]):
        result = _run(root, argv)
        _answers(result, argv)
        assert result.exit_code == 2, (argv, result.output)
        (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
        assert Path(target).name in line and (f"{field}:" in line or field in line), \
            (argv, line)
    assert not (tmp_path / "r.png").exists()
    assert _snapshot(root) == before


def test_a_runs_listing_shows_a_hostile_run_as_damaged(template, tmp_path):
    root, run_id = _copy(template, tmp_path)
    _write(root, run_id, "ledger.jsonl", [{"attempt": 1, "nodes": [1, 2]}])
    result = _run(root, ["runs", "--json"])
    _answers(result, ["runs"])
    (row,) = json.loads(result.output)
    assert row["state"] == "DAMAGED" and "nodes[0]" in row["detail"], row


def _with_a_key_twice(record: dict, key: str, value) -> str:
    """``record`` as one JSON line giving ``key`` again at its end, as a hand edit or another
    tool may leave it (``json.dumps`` cannot write one)."""
    return json.dumps(record)[:-1] + f", {json.dumps(key)}: {json.dumps(value)}}}"


@pytest.mark.parametrize("target, record, key", [
    ("ledger.jsonl", {"attempt": 1, "exit_reason": "preempted"}, "exit_reason"),
    ("events.jsonl", {"event": "cancel", "time": "2026-01-01T00:00:00+00:00"}, "event"),
    ("metrics.jsonl", {"step": 1, "loss": 2.0}, "loss"),
])
def test_a_record_giving_a_key_twice_is_damage_naming_the_line_and_the_key(template, tmp_path,
                                                                          target, record, key):
    """JSON keeps the last of two values of one key silently; which one a person or another
    tool meant cannot be told, so such a record is damage, like a record of the wrong type:
    one ``Error:`` line naming the file, the line and the key, the run listed as DAMAGED."""
    root, run_id = _copy(template, tmp_path)
    path = root / run_id / target
    path.write_text(json.dumps(record) + "\n" + _with_a_key_twice(record, key, 7) + "\n")
    before = _snapshot(root)
    for argv in (["status", run_id], ["report", run_id, "-o", str(tmp_path / "r.png")]):
        result = _run(root, argv)
        _answers(result, argv)
        assert result.exit_code == 2, (argv, result.output)
        (line,) = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
        assert target in line and f"line 2: an object gives the key {key!r} twice" in line, line
    result = _run(root, ["runs", "--json"])
    _answers(result, ["runs"])
    (row,) = json.loads(result.output)
    assert row["state"] == "DAMAGED" and "twice" in row["detail"], row
    assert _snapshot(root) == before


@pytest.mark.parametrize("files, total, words", [
    ({"a\x00b": {"size": 1}}, 0, "NUL"),
    ({"state.json": {"size": 3}}, "abc", "total_bytes"),
    ({"../../run.yaml": {"size": 1}}, 0, "'..'"),
    ({"/etc/passwd": {"size": 1}}, 0, "absolute"),
    ({"state.json": {"size": "3"}}, 3, "size"),
    ({"state.json": [3]}, 3, "state.json"),
])
def test_a_hostile_manifest_is_a_checkpoint_with_a_problem(template, tmp_path, files, total,
                                                           words):
    """The checkpoint is listed, not complete, with what is wrong; the run is not damaged:
    its checkpoint folder is the runtime's to quarantine."""
    root, run_id = _copy(template, tmp_path)
    _write(root, run_id, MANIFEST, [_manifest(run_id, files=files, total_bytes=total)])
    before = _snapshot(root)
    for argv in (["status", run_id], ["report", run_id, "-o", str(tmp_path / "r.png")]):
        result = _run(root, argv)
        _answers(result, argv)
        assert result.exit_code == 0, (argv, result.output)
    assert "Checkpoint  none complete yet" in _run(root, ["status", run_id]).output
    data = json.loads(_run(root, ["status", run_id, "--json"]).output)
    (ck,) = data["checkpoints"]["checkpoints"]
    assert not ck["complete"] and "manifest.json" in ck["problem"] and words in ck["problem"], ck
    assert _snapshot(root) == before


def test_a_good_manifest_still_makes_a_complete_checkpoint(template, tmp_path):
    root, run_id = _copy(template, tmp_path)
    _write(root, run_id, MANIFEST, [_manifest(run_id)])
    data = json.loads(_run(root, ["status", run_id, "--json"]).output)
    assert data["checkpoint"]["step"] == 10 and data["checkpoint"]["bytes"] == 3, data


def test_what_the_runtime_writes_still_passes():
    """The records hpctrain writes (a non-finite loss as text, nulls where a field is unknown,
    an in-job restart, a straggler, a requeue event whose ``nodes`` is a count) are not
    damage."""
    assert reader.metric_problem({"kind": "train", "step": 3, "loss": "nan", "grad_norm": "inf",
                                  "lr": 1e-4, "tokens_per_s": None, "mfu": None,
                                  "stragglers": [{"node": "n2", "ranks": [2, 3], "ratio": 1.5,
                                                  "seconds": 0.2, "median_s": 0.1,
                                                  "intervals": 3}]}) is None
    assert reader.ledger_problem({
        "attempt": 2, "start_step": 0, "end_step": None, "exit_reason": "failed",
        "exit_code": -9, "checkpoint_loaded": None, "last_loss": None, "start_time": 1.7e9,
        "end_time": 1.7e9 + 5, "nodes": ["n1", "n2"], "duration_s": 5.0,
        "decision": {"requeue": False, "reason": "failed"},
        "first_failure": {"rank": 1, "node": "n2", "time": 1.7e9, "message": "boom"},
        "in_job_restart": {"nodes": ["n1", "n3"], "excluded": ["n2"], "spares": ["n3"],
                           "why": "x", "in_place": False, "recovery_s": None,
                           "steps_lost": None},
        "task_exits": [{"node": "n2", "code": 1}], "hang": {"rank": 1, "node": "", "step": None},
        "straggler": {"node": "n2", "ranks": [2]}}) is None
    assert reader.event_problem({"event": "requeue", "nodes": 2, "excluded": ["n2"]}) is None
    assert reader.event_problem({"event": "attempt_start", "attempt": 1,
                                 "nodes": "node[1-2]", "restart_count": 0}) is None


def test_nested_problems_name_the_item():
    assert reader.ledger_problem({"nodes": ["a", 1]}) == \
        "nodes[1]: expected text (no NUL byte), got 1"
    assert reader.ledger_problem({"decision": {"reason": 5}}).startswith(
        "decision.reason: expected text")
    assert reader.metric_problem({"step": 1, "loss": float("nan")}).startswith("loss: expected")
    assert reader.metric_problem({"loss": 1.0}) == "step: missing (absent)"
    assert reader.meta_problem({"job_history": None}).startswith("job_history: expected")
    assert reader.field_problem({"x": 2 ** 63}, {"x": reader.INT}).startswith(
        "x: expected an integer")
    assert reader.field_problem({"x": 10 ** 5000}, {"x": reader.COUNT}).endswith(
        "got a very large integer")       # past the digits Python's repr() gives


def test_a_json_nan_or_infinity_literal_is_named_as_written():
    """JSON's NaN/Infinity literals (``json.dumps`` writes them) read as "expected ... or
    'inf', got inf", as if the reader refused what it asks for."""
    assert reader.metric_problem({"step": 1, "loss": float("inf")}).endswith(
        "got Infinity (a JSON literal, not a number JSON allows)")
    assert reader.metric_problem({"step": 1, "loss": float("nan")}).endswith("got NaN (a JSON "
                                                                            "literal, not a number JSON allows)")
    assert reader.metric_problem({"step": 1, "loss": "inf"}) is None


# ---- the property -------------------------------------------------------------------------------

_odd_text = st.sampled_from(["", "\x00", "a\x00b", "step-\u00b2", "step-" + "9" * 40, "nan",
                             "inf", "-inf", "../..", "/etc/passwd", "\u0663", "\n", "x" * 200,
                             "\ud800", "\U0001f600"])
_odd_number = st.sampled_from([-1, 0, 1, 2 ** 63, 2 ** 63 - 1, -2 ** 63 - 1, 10 ** 30, 1e308,
                               -1e308, 1e300, 1e100, -1e100, 5e-324, reader.MAX_EPOCH,
                               float("nan"), float("inf"), float("-inf")])
_scalar = st.one_of(_odd_number, _odd_text, st.none(), st.booleans(), st.integers(),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6))
# the fields of nested records (a decision, an in-job restart, a straggler, a manifest's file)
INNER = sorted({*reader.RESTART_TYPES, *reader.STRAGGLER_TYPES, "requeue", "reason", "in_job",
                "rank", "message", "values", "id", "index", "dir", "size", "crc32c"})
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(INNER) | _odd_text, inner, max_size=4),
                      max_leaves=8)
EVENTS = ["attempt_start", "straggler", "in_job_restart", "checkpoint_saved", "cancel", "resume",
          "attempt_end", "hang", "requeue", "submitted"]

# each file: a valid record of it, and the fields its readers use (what the hostile values
# replace)
TARGETS = {
    "ledger.jsonl": (lambda run_id: {
        "attempt": 1, "start_step": 0, "end_step": 5, "exit_reason": "preempted",
        "exit_code": 75, "nodes": ["n1"], "job_id": "41", "duration_s": 10.0,
        "start_time": 1.7e9, "end_time": 1.7e9 + 10, "checkpoint_saved": "/ck/step-00000005",
        "decision": {"requeue": True, "reason": "preempted"}}, sorted(reader.LEDGER_TYPES)),
    "events.jsonl": (lambda run_id: {"event": "attempt_start",
                                     "time": "2026-01-01T00:00:00+00:00", "attempt": 1,
                                     "step": 3},
                     sorted({*reader.EVENT_TYPES, *(k for kind in reader.EVENT_KIND_TYPES.values()
                                                    for k in kind), "force", "ranks"})),
    "metrics.jsonl": (lambda run_id: {"kind": "train", "step": 3, "loss": 2.5,
                                      "tokens_per_s": 100.0, "mfu": 0.3, "attempt": 1},
                      sorted(reader.METRIC_TYPES)),
    "run.yaml": (lambda run_id: {}, sorted(reader.META_TYPES)),
    MANIFEST: (_manifest, sorted({*reader.MANIFEST_TYPES, "format"})),
}


@st.composite
def _records(draw, target: str, run_id: str) -> list[dict]:
    base, keys = TARGETS[target]
    out = []
    for _ in range(draw(st.integers(1, 1 if target in ("run.yaml", MANIFEST) else 3))):
        record = {**base(run_id), **draw(st.dictionaries(st.sampled_from(keys), _value,
                                                         min_size=1, max_size=3))}
        if target == "events.jsonl" and draw(st.booleans()):
            record["event"] = draw(st.sampled_from(EVENTS))
        if target == MANIFEST and draw(st.booleans()):
            record["files"] = draw(st.dictionaries(_odd_text | st.text(max_size=4), _value,
                                                   max_size=3))
        out.append(record)
    return out


@settings(max_examples=EXAMPLES)
@given(data=st.data(), target=st.sampled_from(sorted(TARGETS)))
def test_hostile_records_never_break_status_nor_report(template, tmp_path_factory, data,
                                                       target):
    """Property: valid JSON records with hostile field values, in a real run folder: ``status``
    (text and JSON) and ``report`` exit 0, or 2 with one ``Error:`` line; never a traceback
    nor an internal error; no file of the run folder changes. A record that also gives one of
    its keys twice is always damage: exit 2, naming the file."""
    base = tmp_path_factory.mktemp("hostile")
    root, run_id = _copy(template, base)
    records = data.draw(_records(target, run_id), label="records")
    path = _write(root, run_id, target, records)
    twice = target.endswith(".jsonl") and data.draw(st.booleans(), label="a key given twice")
    if twice:       # the first record gives one of its keys again: damage, whatever else it holds
        key = data.draw(st.sampled_from(sorted(records[0])), label="key")
        lines = path.read_text().splitlines()
        lines[0] = _with_a_key_twice(records[0], key, data.draw(_value, label="second value"))
        path.write_text("\n".join(lines) + "\n")
    before = _snapshot(root)
    out = base / "report.png"
    for argv in (["status", run_id], ["status", run_id, "--json"],
                 ["report", run_id, "-o", str(out)]):
        result = _run(root, argv)
        _answers(result, argv)
        if twice:
            assert result.exit_code == 2 and target in result.output, (argv, result.output)
        if argv[0] == "report" and result.exit_code == 0:
            assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert _snapshot(root) == before


# ---- what passes the door is safe --------------------------------------------------------------

_text = _odd_text.filter(lambda t: t != "\ud800")      # text (an unpaired surrogate is not)
_number = _odd_number.filter(lambda n: n == n and abs(n) <= reader.MAX_NUMBER)


def _passing(kinds: tuple) -> st.SearchStrategy:
    """Values the reader's check takes as one of ``kinds``, the extremes first: what a record
    that passes may hold."""
    options = []
    for kind in kinds:
        if isinstance(kind, reader.Fields):
            options.append(st.fixed_dictionaries(
                {k: _passing(kind.types[k]) for k in kind.required},
                optional={k: st.none() | _passing(v) if k not in kind.not_null else _passing(v)
                          for k, v in kind.types.items() if k not in kind.required}))
        elif isinstance(kind, reader.ListOf):
            options.append(st.lists(_passing(kind.kinds), max_size=3))
        elif kind in (str,) or kind is reader.TEXT[0]:
            options.append(st.text(max_size=8) | _text)
        elif kind in (bool, dict, list):
            options.append({bool: st.booleans(), dict: st.dictionaries(_text, _text | _number,
                                                                       max_size=2),
                            list: st.lists(_text | _number, max_size=2)}[kind])
        else:
            candidates = [0, 1, 2 ** 63 - 1, -2 ** 63 + 1, 1e100, -1e100, 5e-324, 0.5,
                          reader.MAX_EPOCH, "nan", "inf", "-inf", "", "n1", "a b", "\u00b2",
                          "step-\u00b2", "\n", "/", "/ck/a b\u00b2", "slurm", "local",
                          "train", "validation", "test"]
            fits = [c for c in candidates if kind.test(c)]
            options.append(st.sampled_from(fits) | st.integers(0, 10 ** 6).filter(kind.test))
    return st.one_of(options)


PASSING = {"ledger.jsonl": reader.LEDGER_TYPES, "metrics.jsonl": reader.METRIC_TYPES,
           "run.yaml": {k: v for k, v in reader.META_TYPES.items() if k != "jobs"}}


# a quarter of the budget: each example draws a report (matplotlib, a few seconds on 2 cores)
@settings(max_examples=max(EXAMPLES // 4, 5))
@given(data=st.data(), target=st.sampled_from(sorted(PASSING) + ["events.jsonl"]))
def test_records_that_pass_the_reader_are_safe_for_status_and_report(template, tmp_path_factory,
                                                                    data, target):
    """Property: records built from the reader's own field types (extreme but accepted
    values: 2**63-1 steps, 1e100 losses, odd names) pass its check, and ``status`` and
    ``report`` show the run (exit 0)."""
    if target == "events.jsonl":
        kind = data.draw(st.sampled_from(sorted(reader.EVENT_KIND_TYPES)))
        types = {**reader.EVENT_TYPES, **reader.EVENT_KIND_TYPES[kind]}
    else:
        kind, types = None, PASSING[target]
    check = {"ledger.jsonl": reader.ledger_problem, "metrics.jsonl": reader.metric_problem,
             "run.yaml": reader.meta_problem, "events.jsonl": reader.event_problem}[target]
    records = []
    for _ in range(data.draw(st.integers(1, 1 if target == "run.yaml" else 3))):
        record = data.draw(st.fixed_dictionaries(
            {}, optional={k: _passing(v) for k, v in types.items()}))
        if target == "ledger.jsonl":
            # 0 (older folders) to the attempt door's bound: past it, the next attempt would
            # have no number (record.folder.attempt_number)
            record["attempt"] = data.draw(
                st.integers(0, limits.INTEGERS["log_attempt"][2]) | st.none())
        if target == "metrics.jsonl":
            record["step"] = data.draw(_passing(reader.COUNT))
        if kind:
            record["event"] = kind
        assert check(record) is None, (record, check(record))
        records.append(record)
    base = tmp_path_factory.mktemp("passing")
    root, run_id = _copy(template, base)
    _write(root, run_id, target, records)
    out = base / "report.png"
    for argv in (["status", run_id], ["status", run_id, "--json"],
                 ["report", run_id, "-o", str(out)]):
        result = _run(root, argv)
        _answers(result, argv)
        assert result.exit_code == 0, (argv, result.output)
