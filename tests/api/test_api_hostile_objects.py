"""The Python API given what no YAML file can hold: objects whose ``repr`` or ``str`` raises,
bytes, numpy numbers, arguments of the wrong type, and a ``JobConfig`` or ``ClusterProfile``
built or changed in Python (``dataclasses.replace`` and attribute assignment skip every check
of the loader). Each is one ``HpcTrainError`` naming the argument or the field, never a
TypeError, a ZeroDivisionError or a planner that runs for hours, and nothing is created."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import hpctrain
from hpctrain.config import load_job, load_profile
from hpctrain.config.safety import short
from hpctrain.errors import ConfigError, HpcTrainError, UsageError
from hpctrain.file_door import show
from tests.conftest import REPO

JOB = str(REPO / "examples" / "tiny.yaml")


class ReprRaises:
    def __repr__(self):
        raise RuntimeError("repr fails")

    def __str__(self):
        raise RuntimeError("str fails")


class ReprPrintsEscapes:
    def __repr__(self):
        return "evil\n\x1b]0;title\x07"


def _replaced(obj, path: str, value):
    """``obj`` (a dataclass tree) with the field at dotted ``path`` set to ``value``, as a
    caller would with ``dataclasses.replace`` or plain assignment: no check runs."""
    obj = copy.deepcopy(obj)
    *sections, name = path.split(".")
    node = obj
    for part in sections:
        node = getattr(node, part)
    setattr(node, name, value)
    return obj


@pytest.mark.parametrize("call, named", [
    (lambda d: hpctrain.submit(ReprRaises(), dry_run=True, runs_dir=d), "job: expected"),
    (lambda d: hpctrain.submit(JOB, profile=b"local", dry_run=True, runs_dir=d), "profile: expected"),
    (lambda d: hpctrain.submit(JOB, dry_run=True, runs_dir=str(d) + "\0x"), "runs_dir: the path"),
    (lambda d: hpctrain.submit(JOB, dry_run=True, runs_dir=d, sweep=[5]), "sweep: expected"),
    (lambda d: hpctrain.submit(JOB, dry_run=True, runs_dir=d, sweep={1: [2]}), "sweep: a key"),
    (lambda d: hpctrain.submit(JOB, dry_run=True, runs_dir=d, sweep={"train.lr": [object()]}),
     "sweep train.lr: <object object"),
    (lambda d: hpctrain.submit(JOB, dry_run=True, runs_dir=d, sweep={"train.steps": [10**5000]}),
     "sweep train.steps: a number of about 5001 digits is past the range"),
    (lambda d: hpctrain.submit(JOB, dry_run=True, runs_dir=d,
                               overrides={"train.lr": ReprRaises()}), "train.lr: expected a number"),
    (lambda d: hpctrain.submit({**_TINY, "name": ReprRaises()}, dry_run=True, runs_dir=d),
     "job mapping: name: expected a string, got <ReprRaises instance"),
    (lambda d: hpctrain.Run(None), "path: expected"),
    (lambda d: hpctrain.Run(5), "path: expected"),
    (lambda d: hpctrain.Run(b"runs/x"), "path: expected"),
    (lambda d: hpctrain.Run("  "), "path: expected"),
    (lambda d: hpctrain.Run(ReprRaises()), "path: expected"),
    (lambda d: hpctrain.runs(str(d) + "\0"), "runs_dir: the path"),
    # the limit was quoted with its repr: an object whose repr raises escaped as that error
    (lambda d: hpctrain.runs(d, limit=ReprRaises()), "limit: expected an integer of at least 0"),
    (lambda d: hpctrain.runs_table(d, limit=ReprRaises()), "limit: expected"),
])
def test_wrong_types_and_hostile_objects_are_one_error_naming_the_argument(tmp_path, call, named):
    with pytest.raises(HpcTrainError) as err:
        call(tmp_path / "runs")
    assert named in str(err.value) and str(err.value).isprintable()
    assert not (tmp_path / "runs").exists()


_TINY = __import__("yaml").safe_load(open(JOB))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return hpctrain.submit(JOB, dry_run=True, runs_dir=root)


@pytest.mark.parametrize("kwargs, named", [
    ({"poll_s": float("nan")}, "poll_s"), ({"poll_s": -1}, "poll_s"), ({"poll_s": 0}, "poll_s"),
    ({"poll_s": "2"}, "poll_s"), ({"poll_s": 1e300}, "poll_s"),
    ({"timeout_s": float("nan")}, "timeout_s"), ({"timeout_s": -1}, "timeout_s"),
    ({"timeout_s": float("inf")}, "timeout_s"), ({"timeout_s": "5"}, "timeout_s"),
    ({"echo": 5}, "echo")])
def test_wait_refuses_seconds_that_would_spin_overflow_or_never_end(dry_run, kwargs, named):
    """A NaN timeout never expired (``elapsed > nan`` is false), a poll of 0 read the run's
    files in a busy loop, -1 and 1e300 were ValueError and OverflowError from time.sleep."""
    with pytest.raises(UsageError, match=rf"^{named}: expected"):
        dry_run.wait(**kwargs)
    assert dry_run.wait(poll_s=0.05, timeout_s=60) == "NOT SUBMITTED"


@pytest.mark.parametrize("call, named", [
    (lambda r: r.metrics(kind="val"), "kind: expected 'train', 'validation', 'test' or None"),
    (lambda r: r.metrics(kind=ReprRaises()), "kind: expected"),
    (lambda r: r.metrics(kind=["train"]), "kind: expected"),
    (lambda r: r.metrics(as_frame="yes"), "as_frame: expected True or False"),
    (lambda r: r.latest_metrics("eval"), "kind: expected 'train', 'validation', 'test', got"),
    (lambda r: r.latest_metrics(None), "kind: expected"),
])
def test_a_metrics_kind_that_names_no_records_is_an_error_not_an_empty_list(dry_run, call,
                                                                            named):
    """A typo such as ``kind="val"`` selected nothing, and read as a run that never
    evaluated; ``latest_metrics(None)`` matched no record either."""
    dry_run.metrics_file.write_text('{"step": 1, "loss": 2.0}\n'
                                        '{"kind": "validation", "step": 1, "loss": 2.5}\n')
    with pytest.raises(UsageError) as err:
        call(dry_run)
    assert str(err.value).startswith(named) and str(err.value).isprintable()
    assert [r["step"] for r in dry_run.metrics(kind="validation")] == [1]
    assert len(dry_run.metrics(kind=None)) == 2
    assert dry_run.latest_metrics("validation")["loss"] == 2.5


def test_numpy_and_fraction_numbers_are_the_numbers_they_stand_for(tmp_path):
    """``np.arange`` and ``np.linspace`` give numpy numbers: a job mapping or a sweep built
    from them is the job written with plain numbers (np.int64 was "expected an integer, got
    np.int64(10)", and a sweep of them a TypeError from json)."""
    import yaml
    from fractions import Fraction
    data = yaml.safe_load(open(JOB))
    data["train"]["steps"] = np.int64(40)
    data["train"]["lr"] = np.float32(0.5)
    data["train"]["clip_grad"] = Fraction(1, 2)
    run = hpctrain.submit(data, dry_run=True, runs_dir=tmp_path / "a")
    job = run.resolved_job()
    assert (job.train.steps, job.train.lr, job.train.clip_grad) == (40, 0.5, 0.5)
    assert type(job.train.steps) is int and type(job.train.lr) is float
    runs = hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path / "b",
                           sweep={"train.steps": np.arange(20, 60, 20)})
    assert sorted(r.resolved_job().train.steps for r in runs) == [20, 40]


def test_a_job_object_changed_in_python_is_checked_before_the_planner_runs():
    """``plan`` took a JobConfig as it came: num_layers=10**6 kept the planner busy for hours,
    NaN, None or "4" were TypeErrors, a global batch of 0 a ZeroDivisionError."""
    job = load_job(JOB)
    for path, value, said in [("model.num_layers", 10**6, "must be at most 512"),
                              ("model.num_layers", float("nan"), "expected an integer"),
                              ("model.num_layers", None, "expected an integer, got nothing"),
                              ("model.num_layers", "4", "expected an integer"),
                              ("batch.global_batch_size", 0, "must be at least 1")]:
        with pytest.raises(ConfigError, match=rf"{path}: {said}"):
            hpctrain.plan(_replaced(job, path, value))
    # a job given as a mapping is planned as its file is
    import yaml
    assert hpctrain.plan(yaml.safe_load(open(JOB))) == hpctrain.plan(JOB)


@pytest.mark.parametrize("path, value, said", [
    ("slurm.gpus_per_node", 0, "slurm.gpus_per_node: must be at least 1"),
    ("slurm.gpus_per_node", "4", "slurm.gpus_per_node: expected an integer"),
    ("slurm.nodes", 0, "slurm.nodes: must be at least 1"),
    ("node.gpu_memory_gb", float("nan"), "node.gpu_memory_gb: expected a finite number"),
    ("slurm", None, "slurm: expected a mapping, got nothing"),
    ("scheduler", "bogus", "scheduler: expected one of slurm, local"),
    ("name", "-x", "name: '-x' is not a valid profile name"),
    ("name", "", "name: missing"),
    ("env", [1], "env: expected a mapping, got a list"),
    ("slurm.time_limit", "forever", "slurm.time_limit: 'forever' is not a Slurm time limit"),
    ("slurm.partition", "gpu\n#SBATCH --x", "slurm.partition: 'gpu\\\\n#SBATCH --x' holds a line feed"),
])
def test_a_profile_object_changed_in_python_is_checked_as_its_file_would_be(tmp_path, path,
                                                                             value, said):
    """A ClusterProfile given to ``submit`` or ``plan`` went to the planner and the template
    unchecked: gpus_per_node 0 was a ZeroDivisionError, ``scheduler: "bogus"`` and a time limit
    of "forever" were submitted."""
    profile = _replaced(load_profile("dev-slurm"), path, value)
    for call in (lambda: hpctrain.plan(JOB, profile=profile),
                 lambda: hpctrain.submit(JOB, profile=profile, dry_run=True,
                                         runs_dir=tmp_path / "runs")):
        with pytest.raises(ConfigError, match=said):
            call()
    assert not (tmp_path / "runs").exists()


def test_an_unchanged_profile_object_plans_as_its_name_does():
    assert hpctrain.plan(JOB, profile=load_profile("dev-slurm")) == \
        hpctrain.plan(JOB, profile="dev-slurm")


def _fields(obj, prefix=""):
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _fields(value, path + ".")
        else:
            yield path


_PROFILE = load_profile("dev-slurm")
_HOSTILE = st.one_of(
    st.sampled_from([None, 0, -1, 10**30, -10**30, float("nan"), float("inf"), True, "", " ",
                     "-x", "a\nb", "\x1b]0;t\x07", "4", [1], {1: 2}, {"a": None}, b"x",
                     np.int64(3), ReprRaises(), ReprPrintsEscapes()]),
    st.text(max_size=20), st.integers(), st.floats())


@given(st.sampled_from(sorted(_fields(_PROFILE))), _HOSTILE)
def test_any_field_of_a_profile_object_is_checked_or_accepted(path, value):
    """Property: whatever one field of a profile object holds, ``plan`` answers with a plan or
    one HpcTrainError whose message is printable text (each problem on its line)."""
    profile = _replaced(_PROFILE, path, value)
    try:
        data = hpctrain.plan(JOB, profile=profile)
    except HpcTrainError as e:
        assert all(line.isprintable() for line in str(e).splitlines())
    else:
        assert data["world_size"] >= 1


_ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.binary(),
    st.lists(st.integers(), max_size=3), st.sampled_from([ReprRaises(), ReprPrintsEscapes(),
                                                          list(range(100_000)), "x" * 100_000]))


@given(_ANYTHING, st.integers(20, 200))
def test_a_value_quoted_in_a_message_is_one_short_printable_line(value, limit):
    """Property: ``config.safety.short``, the one way a message quotes a value it was given,
    never raises (an object whose repr raises is named by its type) and gives one printable
    line about ``limit`` long, however big the value."""
    text = short(value, limit)
    assert text.isprintable() and len(text) <= limit + 30
    assert show(text) == text


def test_a_quoted_value_says_what_it_is():
    assert short(ReprRaises()).startswith("<ReprRaises instance at")
    assert short(ReprPrintsEscapes()) == "evil\\n\\x1b]0;title\\x07"
    assert short(list(range(10**6))) == "[0, 1, 2, 3, 4, 5, ...]"
    assert short(10**40) == "a number of about 41 digits"
    assert math.isnan(float(short(float("nan"))))


class _StrRaises(str):
    def __str__(self):
        raise RuntimeError("__str__ on purpose")


class _PathRaises(type(__import__("pathlib").Path())):
    def __fspath__(self):
        raise RuntimeError("__fspath__ on purpose")


def test_path_arguments_whose_own_conversion_raises_are_usage_errors(tmp_path):
    """A str or Path subclass is read once, at the door, as the text it holds: a ``__str__``
    that raises is never called; a ``__fspath__`` that raises is one UsageError naming the
    argument."""
    import hpctrain
    from hpctrain.errors import UsageError
    run = hpctrain.Run(_StrRaises(str(tmp_path / "nowhere")))
    assert type(run.path).__name__ != "_StrRaises"
    for call, named in ((lambda: hpctrain.Run(_PathRaises(tmp_path)), "path"),
                        (lambda: hpctrain.submit(_PathRaises(tmp_path / "j.yaml"), dry_run=True,
                                                 runs_dir=tmp_path / "runs"), "job"),
                        (lambda: hpctrain.runs(_PathRaises(tmp_path)), "runs_dir")):
        with pytest.raises(UsageError) as err:
            call()
        assert str(err.value).startswith(f"{named}: expected ")
    assert not (tmp_path / "runs").exists()


def test_a_filesystem_error_inside_an_api_call_is_worded_as_the_cli_words_it(tmp_path):
    import hpctrain
    from hpctrain.errors import HpcTrainError
    from tests.conftest import REPO
    with pytest.raises(HpcTrainError) as err:
        hpctrain.submit(str(REPO / "examples" / "tiny.yaml"), dry_run=True,
                        runs_dir="/proc/self/hpctrain-no-such-folder")
    assert not isinstance(err.value, OSError)
    assert "/proc/" in str(err.value) and "\n" not in str(err.value)


class _ItemsRaise(dict):
    """A mapping whose every way of being read raises (a dict subclass a caller wrote)."""

    def items(self):
        raise RuntimeError("items on purpose")

    def keys(self):
        raise RuntimeError("keys on purpose")

    def __iter__(self):
        raise RuntimeError("__iter__ on purpose")


def _raises_half_way(*first):
    yield from first
    raise RuntimeError("a generator that fails on purpose")


def _holds_itself():
    d = {"train": {}}
    d["train"]["again"] = d
    return d


@pytest.mark.parametrize("kwargs, named", [
    ({"sweep": _ItemsRaise({"train.lr": [1e-4, 3e-4]})}, "sweep: reading it raised RuntimeError"),
    ({"sweep": {"train.lr": _raises_half_way(1e-4)}}, "sweep: reading it raised RuntimeError"),
    ({"overrides": _ItemsRaise({"train.lr": 1e-4})}, "overrides: reading it raised RuntimeError"),
    ({"job": _ItemsRaise(_TINY)}, "job: reading it raised RuntimeError"),
    ({"job": {**_TINY, "train": _ItemsRaise(_TINY["train"])}}, "job: reading it raised"),
    ({"job": {**_TINY, "data": {**_TINY["data"], "blend": _raises_half_way()}}},
     "job mapping: data.blend"),
    ({"job": _holds_itself()}, "job: nested more than 32 levels deep"),
])
def test_a_caller_s_container_that_raises_while_read_is_one_error_naming_the_argument(
        tmp_path, kwargs, named):
    """A job mapping, ``overrides`` or a ``sweep`` is read once, at the API's door, into plain
    data: whatever a caller's mapping or generator raises while being read is one UsageError
    naming the argument (a dict subclass whose ``items()`` raised was a raw RuntimeError from
    deep inside the sweep's expansion), and nothing is created."""
    job = kwargs.pop("job", JOB)
    with pytest.raises(HpcTrainError) as err:
        hpctrain.submit(job, dry_run=True, runs_dir=tmp_path / "runs", **kwargs)
    assert str(err.value).startswith(named) or named in str(err.value), str(err.value)
    assert "\n" not in str(err.value) and str(err.value).isprintable()
    assert not (tmp_path / "runs").exists()


def test_plain_subclasses_and_iterables_are_read_as_the_data_they_hold(tmp_path):
    """What is read at the door is the same job: a ``str`` subclass is its text, a tuple a
    list, a sweep's values any iterable (a range, a generator, a numpy array) of at most the
    sweep's bound."""
    from collections import OrderedDict

    class Text(str):
        def strip(self, *a):
            raise RuntimeError("not asked again")

    job = OrderedDict(_TINY, name=Text("tiny-subclass"))
    runs = hpctrain.submit(job, dry_run=True, runs_dir=tmp_path / "runs",
                           sweep={"train.lr": (x for x in np.array([1e-3, 3e-3]))},
                           overrides=OrderedDict({"train.steps": np.int64(6)}))
    assert [r.resolved_job().train.lr for r in runs] == [1e-3, 3e-3]
    assert {r.resolved_job().train.steps for r in runs} == {6}
    assert runs[0].meta()["overrides"] == {"train.steps": 6}       # as YAML writes it
    assert runs[0].resolved_job().name == "tiny-subclass"
    with pytest.raises(UsageError, match=r"sweep train.lr: more than 1,000 values"):
        hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path / "more",
                        sweep={"train.lr": (1e-4 * i for i in __import__("itertools").count(1))})


_CONTAINERS = st.sampled_from(["dict", "items-raise", "tuple", "generator"])


@given(st.sampled_from(["model", "train", "batch", "data", "parallel"]), _CONTAINERS)
def test_any_section_of_a_job_mapping_in_any_container_is_read_or_refused_in_one_line(section,
                                                                                    container):
    """Property: a section of a job mapping given as any container a caller might build is
    either the job (a plain copy of it) or one printable HpcTrainError line naming ``job``."""
    value = _TINY.get(section, {})
    wrapped = {"dict": lambda v: dict(v), "items-raise": _ItemsRaise,
               "tuple": lambda v: tuple(v.items()),
               "generator": lambda v: (kv for kv in v.items())}[container](value)
    try:
        data = hpctrain.plan({**_TINY, section: wrapped})
    except HpcTrainError as e:
        assert str(e).isprintable() and container != "dict", str(e)
        assert str(e).startswith("job") or section in str(e), str(e)
    else:
        assert container == "dict" and data["world_size"] >= 1


class _HostileInt(int):
    """An int whose own comparisons and text raise: only the number it holds may be read."""

    def _raise(self, *args):
        raise RuntimeError("an int subclass's method, on purpose")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __str__ = __repr__ = __format__ = _raise
    __hash__ = int.__hash__


class _HostileFloat(float):
    def _raise(self, *args):
        raise RuntimeError("a float subclass's method, on purpose")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __str__ = __repr__ = __format__ = _raise
    __float__ = _raise
    __hash__ = float.__hash__


class _HostileStr(str):
    def _raise(self, *args):
        raise RuntimeError("a str subclass's method, on purpose")

    __eq__ = __ne__ = __hash__ = _raise


def test_int_float_and_str_subclasses_are_read_as_the_plain_value(tmp_path):
    """The doors of numbers and choices (``limits.integer``, ``number``, ``choice``) hand on
    the plain value they checked: an int subclass whose comparisons raise was a RuntimeError
    from ``plan(tp=...)``, ``submit(nodes=...)`` and ``runs(limit=...)``, a str subclass whose
    ``__eq__`` raises one from ``plan(recompute=...)``."""
    assert hpctrain.plan(JOB, tp=_HostileInt(1), micro_batch_size=_HostileInt(1),
                         recompute=_HostileStr("none")) == \
        hpctrain.plan(JOB, tp=1, micro_batch_size=1, recompute="none")
    run = hpctrain.submit(JOB, nodes=_HostileInt(1), chain=_HostileInt(1), dry_run=True,
                          runs_dir=tmp_path / "runs")
    assert [r.id for r in hpctrain.runs(tmp_path / "runs", limit=_HostileInt(1))] == [run.id]
    assert len(hpctrain.runs_table(tmp_path / "runs", limit=_HostileInt(5))) == 1
    assert run.wait(poll_s=_HostileFloat(0.05), timeout_s=_HostileInt(60)) == "NOT SUBMITTED"


class _BoolRaises:
    def __bool__(self):
        raise RuntimeError("__bool__ on purpose")


@pytest.mark.parametrize("overrides", [np.array(["train.lr=1e-3", "train.steps=3"]),
                                       _BoolRaises()])
def test_overrides_of_no_type_submit_takes_are_refused_before_being_asked_anything(tmp_path,
                                                                                   overrides):
    """``overrides`` was asked whether it is empty before its type was checked: a numpy array
    of two "KEY=VALUE" strings was numpy's ValueError (its truth value is ambiguous)."""
    with pytest.raises(UsageError, match=r"^overrides: expected a mapping .* or a list of "
                                         r"'KEY=VALUE' strings, got "):
        hpctrain.submit(JOB, dry_run=True, runs_dir=tmp_path / "runs", overrides=overrides)
    assert not (tmp_path / "runs").exists()
