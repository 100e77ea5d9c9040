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
from hpctrain.errors import ConfigError
from hpctrain.config.kernel_table import load_table
from hpctrain.gpu_table import TableError, table_from_json
from tests.conftest import REPO
from tests.plan.test_plan_step_model import synthetic_table

ATTENTION = [{"backend": "flash", "batch": 1, "heads": 8, "kv_heads": 8, "seq": 1024,
              "head_dim": 128, "forward_s": 1e-3, "backward_s": 2.5e-3}]


def _small() -> dict:
    return synthetic_table(grid=(256, 1024), attention=ATTENTION,
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


def _leaves(data, prefix=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _leaves(v, prefix + (i,))
    yield prefix


HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-2**80, 2**80),
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
    got = table.attention_seconds("flash", 2, 16, 4096, 128)
    assert got is None or all(math.isfinite(x) and x > 0 for x in got), got
