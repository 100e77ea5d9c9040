"""A profile's kernel table (``node.kernel_table``) comes through one door,
``config.kernel_table.load_table``: the config's file door (a regular file of bounded size,
UTF-8 JSON, never a device or a FIFO), then ``table_from_json``, which refuses every value the step-time model
could not use. Whatever the file holds, a profile names it in one line or plans with it."""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hpctrain.config import load_profile
from hpctrain.config.durations import format_duration
from hpctrain.errors import ConfigError
from hpctrain.config.kernel_table import load_table
from hpctrain.gpu_table import TableError, table_from_json
from tests.conftest import REPO
from tests.plan.test_plan_step_model import synthetic_table

ATTENTION = [{"backend": "flash", "batch": 1, "heads": 8, "kv_heads": 8, "seq": 1024,
              "head_dim": 128, "forward_s": 1e-3, "backward_s": 2.5e-3}]


def _small() -> dict:
    """A fresh table each time: a test that changes one of its values changes no other's."""
    return synthetic_table(grid=(256, 1024), attention=[dict(a) for a in ATTENTION],
                           memory={"outside_allocator_bytes": 1 << 30,
                                   "allocator_slack_fraction": 0.02})


def _big_behind_a_link(path):
    (path.parent / "big.json").write_bytes(b" " * ((16 << 20) + 1))
    path.symlink_to(path.parent / "big.json")


def _profile_naming(tmp_path, table: str):
    text = (REPO / "cluster_profiles" / "h100-ib-pyxis.yaml").read_text()
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("  device: cuda\n", f"  device: cuda\n  kernel_table: {table}\n"))
    return path


@pytest.mark.parametrize("make, said", [
    (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.write_bytes(b"\xd5\x00binary"), "is not UTF-8 text"),
    (lambda p: p.write_text("[" * 200_000), "is JSON nested too deeply"),
    (lambda p: p.write_text("[1, 2]"), "expected an object"),
    (lambda p: _big_behind_a_link(p), "may have at most 16,777,216"),
])
def test_a_table_that_is_no_json_file_is_named_in_one_line(tmp_path, make, said):
    target = tmp_path / "t.json"
    make(target)
    with pytest.raises(TableError) as err:
        load_table(target)
    assert str(err.value).startswith(f"kernel table {target}") and "\n" not in str(err.value)
    assert said in str(err.value), str(err.value)
    with pytest.raises(ConfigError) as err:       # through the profile, at its field
        load_profile(str(_profile_naming(tmp_path, "t.json")))
    ((path, message),) = err.value.problems
    assert path == "node.kernel_table" and said in message


def test_a_link_to_a_table_is_followed(tmp_path):
    (tmp_path / "shared.json").write_text(json.dumps(_small()))
    (tmp_path / "t.json").symlink_to(tmp_path / "shared.json")
    assert load_table(tmp_path / "t.json").device == "synthetic"


@pytest.mark.parametrize("change", [
    lambda d: d["gemm"][0].update(seconds=math.inf),
    lambda d: d["gemm"][0].update(m=1e400),
    lambda d: d.update(gemm={"a": 1}),
    lambda d: d.update(measured=[1, 2]),
    lambda d: d["attention"][0].update(backward_s=math.nan),
    lambda d: d.update(bandwidth_gbs=math.inf),
])
def test_values_the_model_cannot_use_are_refused(change):
    data = _small()
    change(data)
    with pytest.raises(TableError):
        table_from_json(json.loads(json.dumps(data)), "t.json")


def _twice(d):
    d["attention"].append(dict(d["attention"][0], forward_s=2e-3))


@pytest.mark.parametrize("change, said", [
    # two measurements of one point: the interpolation between them divides by zero
    (_twice, "attention: flash is measured twice at head_dim 128, seq 1024; keep one"),
    # times no GPU takes: an infinite or zero step, an MFU of 209%
    (lambda d: d["gemm"][0].update(seconds=5e-324), "between 1e-9 and 1e6 seconds"),
    (lambda d: d["attention"][0].update(forward_s=1e-300, backward_s=1e300),
     "between 1e-9 and 1e6 seconds"),
    (lambda d: d.update(bandwidth_gbs=1e-320), "bandwidth_gbs: must be between"),
    (lambda d: d["attention"][0].update(batch=10 ** 400), "sizes must be at most 2**31"),
])
def test_values_that_would_break_the_plan_are_refused_naming_them(change, said):
    data = _small()
    change(data)
    with pytest.raises(TableError) as err:
        table_from_json(data, "t.json")
    assert said in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_text_from_the_table_is_printed_as_printable_text():
    data = _small()
    data["device"] = "evil\n\x1b[31mred"
    data["measured"] = {"date": "x\ny\x1b]0;title\x07"}
    table = table_from_json(data, "t.json")
    for text in (table.device, table.measured["date"]):
        assert "\x1b" not in text and "\n" not in text and "\x07" not in text, text


def _leaves(data, prefix=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _leaves(v, prefix + (i,))
    yield prefix


HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-2**80, 2**80), st.integers(10**300, 10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                         max_size=2))
PATHS = [p for p in _leaves(_small()) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=HOSTILE)
def test_any_value_anywhere_is_refused_or_plans_finite_times(path, value):
    data = _small()
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    try:
        table = table_from_json(data, "t.json")
    except TableError as e:
        assert str(e).startswith("t.json: ") and "\n" not in str(e)
        return
    for op in ("nt", "nn", "tn"):
        for shape in ((256, 1024, 256), (300, 5000, 700), (1 << 20, 1, 1)):
            t = table.gemm_seconds(op, *shape)
            assert math.isfinite(t) and t > 0, (op, shape, t)
            format_duration(t)                   # as plan prints it
    got = table.attention_seconds("flash", 2, 16, 4096, 128)
    assert got is None or all(math.isfinite(x) and x > 0 for x in got), got
    assert "\x1b" not in table.describe() and "\n" not in table.describe()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forward=st.floats(allow_nan=False, allow_infinity=False, min_value=0, exclude_min=True),
       backward=st.floats(allow_nan=False, allow_infinity=False, min_value=0, exclude_min=True))
def test_a_second_attention_point_is_refused_or_interpolated_finitely(forward, backward):
    """A second measurement beside the first (the same point, or twice the sequence): refused,
    or the attention time at any sequence between and beyond them is a finite time."""
    for seq in (1024, 2048):
        data = _small()
        data["attention"].append(dict(data["attention"][0], seq=seq, forward_s=forward,
                                      backward_s=backward))
        try:
            table = table_from_json(data, "t.json")
        except TableError as e:
            assert str(e).startswith("t.json: ") and "\n" not in str(e)
            continue
        for at in (512, 1536, 4096):
            got = table.attention_seconds("flash", 1, 8, at, 128)
            assert got is not None and all(math.isfinite(x) and x > 0 for x in got), got
            format_duration(sum(got))
