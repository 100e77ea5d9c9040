"""The host in the step-time model: the kernel table's ``host`` section (the host's time to issue
a layer's and a microbatch's work, ``hpctrain.bench.host_issue``), read through the table's one
door, and a microbatch slot that takes the longer of the GPU's kernels and the host issuing
them. The measurement itself runs on the CPU here for real (hpctrain's build of megatron-core's
GPT at tiny widths); on a GPU it runs inside ``hpctrain bench kernels`` and tools/gpu_check."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_jobs import LLAMA2_7B, make_job
from test_plan_step_model import synthetic_table

from hpctrain.config import Layout
from hpctrain.config.kernel_table import load_table
from hpctrain.gpu_table import HOST_KINDS, HostIssue, TableError, host_kind, table_from_json
from hpctrain.planner.layouts import Target, plan_layout
from hpctrain.planner.timing import Hardware
from tests.conftest import REPO

# the local spec with torch's fused attention (the kind "torch"), 8 microbatches
LOCAL_7B = dict(LLAMA2_7B, attention_backend="auto", transformer_impl="local")


def host_table(per_layer: float | None, per_microbatch: float = 0.0, kind: str = "torch",
               rate: float = 1e12) -> dict:
    table = synthetic_table(rate=lambda m, n, k: rate * m ** 0.2 * n ** 0.1 * k ** 0.3)
    if per_layer is not None:
        table["host"] = {"per_layer_s": {kind: per_layer},
                         "per_microbatch_s": {kind: per_microbatch}}
    return table


def plan(table: dict, model: dict = LOCAL_7B):
    job = make_job(model, mbs=1, gbs=16, parallel={"use_distributed_optimizer": True})
    target = Target(16, 8, 80 * 2**30, Hardware(989.0, 360.0, 45.0, 8, table_from_json(table)))
    return plan_layout(job, Layout(2, 1, None, 8, 1, 16), target, sequence_parallel=True,
                       recompute=None)


def test_the_kinds_of_layer_are_the_attentions_the_planner_tells_apart():
    assert host_kind("local") == "local"
    assert {host_kind(b) for b in ("torch-auto", "torch-flash", "torch-fused")} == {"torch"}
    assert {host_kind(b) for b in ("auto", "flash", "fused", "unfused")} == {None}
    assert plan(host_table(None)).step is not None
    # the job above runs torch's kernels in the local spec: the "torch" kind
    assert plan(host_table(None)).step.source.startswith("kernel table synthetic")


def test_a_host_slower_than_the_kernels_bounds_every_microbatch_slot():
    """The slot is the longer of the two: the step grows by what the host adds beyond the
    kernels in each slot, MFU falls with it, and the plan says the host bounds the step."""
    gpu = plan(host_table(None, rate=1e15))       # fast GEMMs: little GPU work per layer
    mb = gpu.step.microbatch.total_s
    layers = LOCAL_7B["num_layers"]
    per_layer = 2 * mb / layers                   # the host takes twice the kernels' time
    bound = plan(host_table(per_layer, 1e-3, rate=1e15))
    host_mb = layers * per_layer + 1e-3
    assert bound.step.host_microbatch_s == pytest.approx(host_mb, rel=1e-12)
    assert bound.step.host_s == pytest.approx(bound.step.slots * (host_mb - mb), rel=1e-12)
    assert bound.step.total_s == pytest.approx(gpu.step.total_s + bound.step.host_s, rel=1e-12)
    assert bound.mfu == pytest.approx(gpu.mfu * gpu.step.total_s / bound.step.total_s)
    (note,) = [n for n in bound.step.notes if "host" in n]
    assert "the host bounds the step" in note and f"{host_mb * 1e3:.1f} ms" in note
    # the layout's JSON carries both
    breakdown = bound.to_json()["step_time_breakdown_s"]
    assert breakdown["host_issue_exposed"] == bound.step.host_s
    assert breakdown["one_microbatch"]["host_issue"] == bound.step.host_microbatch_s


def test_a_host_faster_than_the_kernels_changes_nothing():
    slow_gpu = plan(host_table(None))
    measured = plan(host_table(1e-6, 1e-6))
    assert measured.step.total_s == slow_gpu.step.total_s and measured.step.host_s == 0.0
    assert measured.step.host_microbatch_s is not None
    assert not [n for n in measured.step.notes if "host" in n]


def test_without_the_hosts_measurement_of_these_layers_the_plan_warns_instead():
    """A table without a host section, or one that measured another kind of layer (TE's
    layers are not measured), prices the kernels alone and says when the GPU's work per layer
    is small enough for the host to have bounded such steps."""
    for table, model in ((host_table(None, rate=1e15), LOCAL_7B),
                         (host_table(1e-3, kind="local", rate=1e15), LOCAL_7B),
                         (host_table(1e-3, rate=1e15), LLAMA2_7B)):
        p = plan(table, model)
        assert p.step.host_s == 0.0 and p.step.host_microbatch_s is None
        (note,) = [n for n in p.step.notes if "bounded the step" in n]
        assert "no host measurement" in note


def test_the_plan_prints_the_hosts_time(tmp_path):
    from click.testing import CliRunner

    from hpctrain.cli import cli
    from hpctrain.config import yamlio
    table = host_table(5e-3, 1e-3, rate=1e15)
    table["device"] = "NVIDIA H100 80GB HBM3"
    (tmp_path / "t.json").write_text(json.dumps(table))
    profile = yamlio.read_mapping(REPO / "cluster_profiles" / "h100-ib-pyxis.yaml")
    profile["node"]["kernel_table"] = str(tmp_path / "t.json")
    (tmp_path / "p.yaml").write_text(yamlio.dump(profile))
    job = yamlio.read_mapping(REPO / "examples" / "llama2-7b.yaml")
    job["model"].update(transformer_impl="local", attention_backend="auto")
    (tmp_path / "j.yaml").write_text(yamlio.dump(job))
    out = CliRunner().invoke(cli, ["plan", str(tmp_path / "j.yaml"), "--profile",
                                   str(tmp_path / "p.yaml"), "--tp", "2", "--pp", "1"])
    assert out.exit_code == 0, out.output
    assert "the host issues it in" in out.output and "the host beyond the kernels" in out.output
    assert "the host bounds the step" in out.output


# ----------------------------------------------------------------------------- the door
BAD_HOSTS = [
    ("a list", [1, 2]),
    ("per_layer_s missing", {"per_microbatch_s": {"torch": 1e-3}}),
    ("an unknown key", {"per_layer_s": {"torch": 1e-3}, "per_microbatch_s": {"torch": 0.0},
                        "extra": 1}),
    ("an unknown kind", {"per_layer_s": {"te": 1e-3}, "per_microbatch_s": {"te": 0.0}}),
    ("no kind", {"per_layer_s": {}, "per_microbatch_s": {}}),
    ("negative", {"per_layer_s": {"torch": -1e-3}, "per_microbatch_s": {"torch": 0.0}}),
    ("NaN", {"per_layer_s": {"torch": math.nan}, "per_microbatch_s": {"torch": 0.0}}),
    ("infinite", {"per_layer_s": {"torch": 1e-3}, "per_microbatch_s": {"torch": math.inf}}),
    ("over a second", {"per_layer_s": {"torch": 2.0}, "per_microbatch_s": {"torch": 0.0}}),
    ("a string", {"per_layer_s": {"torch": "1e-3"}, "per_microbatch_s": {"torch": 0.0}}),
    ("a boolean", {"per_layer_s": {"torch": True}, "per_microbatch_s": {"torch": 0.0}}),
    ("kinds that differ", {"per_layer_s": {"torch": 1e-3}, "per_microbatch_s": {"local": 0.0}}),
]


@pytest.mark.parametrize("why,host", BAD_HOSTS, ids=[b[0] for b in BAD_HOSTS])
def test_a_bad_host_section_is_refused_naming_it(why, host):
    table = host_table(None)
    table["host"] = host
    with pytest.raises(TableError) as e:
        table_from_json(table, "t.json")
    assert str(e.value).startswith("t.json: host"), (why, str(e.value))


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.sampled_from(["per_layer_s", "per_microbatch_s",
                                                          "local", "torch", "x"]), inner,
                                         max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_whatever_the_host_section_holds_the_door_reads_it_or_names_it(host):
    """Any JSON in ``host``: a HostIssue whose seconds are finite and within 0-1 for the same
    kinds per layer and per microbatch, or a TableError naming ``host``, nothing else."""
    table = host_table(None)
    table["host"] = host
    try:
        read = table_from_json(table, "t.json")
    except TableError as e:
        assert str(e).startswith("t.json: host"), str(e)
        return
    if host is None:
        assert read.host is None
        return
    h = read.host
    assert isinstance(h, HostIssue) and set(h.per_layer_s) == set(h.per_microbatch_s)
    assert set(h.per_layer_s) <= set(HOST_KINDS)
    assert all(0 <= v <= 1 for part in (h.per_layer_s, h.per_microbatch_s)
               for v in part.values())


def test_a_table_with_a_host_section_reads_back_as_it_was_written(tmp_path):
    table = host_table(4.5e-3, 2e-3)
    read = table_from_json(table)
    assert read.host == HostIssue({"torch": 4.5e-3}, {"torch": 2e-3})
    assert table_from_json(read.to_json()).host == read.host
    assert read.host.seconds("torch", 10) == pytest.approx(0.047)
    assert read.host.seconds("local", 10) is None


# ----------------------------------------------------------------------------- the measurement
@pytest.mark.megatron
def test_the_host_is_measured_into_a_table_that_has_none(tmp_path):
    """``python -m hpctrain.bench.kernels host`` (tools/gpu_check with a table measured
    before): this machine's host, both kinds of layer, through hpctrain's own build of the
    model; the table then reads through the door and prices a plan's host; a table that has
    a host section keeps it."""
    path = tmp_path / "table.json"
    path.write_text(json.dumps(host_table(None)))
    spec = json.dumps({"device": "cpu"})
    proc = subprocess.run([sys.executable, "-m", "hpctrain.bench.kernels", "host", spec,
                           str(path)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    host = json.loads(path.read_text())["host"]
    assert set(host["per_layer_s"]) == set(host["per_microbatch_s"]) == set(HOST_KINDS)
    # every layer issues work: a layer's time is above zero (a difference of two depths)
    assert all(v > 0 for v in host["per_layer_s"].values())
    table = load_table(path)
    assert table.host.per_layer_s == host["per_layer_s"]
    assert plan(json.loads(path.read_text())).step.host_microbatch_s == pytest.approx(
        LOCAL_7B["num_layers"] * host["per_layer_s"]["torch"] + host["per_microbatch_s"]["torch"])
    before = path.read_text()
    from hpctrain.bench.kernels import add_host
    add_host(path, "cpu")            # measured already: nothing is measured or written
    assert path.read_text() == before
