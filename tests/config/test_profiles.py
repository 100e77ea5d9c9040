"""Cluster profiles: every shipped one loads; bad ones are refused with every problem at once."""

from __future__ import annotations

import pytest
import yaml

from hpctrain.config import list_profiles, load_profile, profile_from_mapping
from hpctrain.errors import ConfigError, UsageError
from tests.conftest import hpctrain

SHIPPED = ["local", "dev-slurm", "h100-ib-pyxis", "a100-roce"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load(name):
    p = load_profile(name)
    assert p.name == name
    assert p.world_size == p.slurm.nodes * p.slurm.gpus_per_node
    if p.scheduler == "local":
        assert p.slurm.nodes == 1


def test_default_profile_is_local():
    assert load_profile(None).scheduler == "local"


def problems_of(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as err:
        profile_from_mapping(data, "p.yaml")
    return err.value.problems


def test_unknown_key_gets_did_you_mean():
    (path, msg), = problems_of({"slurm": {"partiton": "gpu"}})
    assert path == "slurm.partiton"
    assert "did you mean 'partition'" in msg


def test_every_problem_is_reported_at_once():
    probs = dict(problems_of({
        "slurm": {"gpus_per_node": "four", "partition": "gpu; rm -rf ~", "time_limit": "forever"},
        "preemption": {"signal": "USR3"},
        "env": {"BAD KEY": "1"},
    }))
    assert probs["slurm.gpus_per_node"] == "expected an integer, got 'four'"
    assert "not a valid Slurm partition name" in probs["slurm.partition"]
    assert "not a Slurm time limit" in probs["slurm.time_limit"]
    assert "did you mean 'USR2'" in probs["preemption.signal"]
    assert "not a valid environment variable name" in probs["env.BAD KEY"]


@pytest.mark.parametrize("directive, expect", [
    ("--comment=ok", None),
    ("--mail-type=END", None),
    ("--comment=x\n#SBATCH --wrap=id", "must be one line"),
    ("--comment=x\n", "must be one line"),
    ("--comment=hetjob", "heterogeneous-job component"),
    ("--comment=$(id)", "not a valid sbatch directive"),
    ("--wrap=hostname", "--wrap is managed by hpctrain"),
    ("--signal=USR2@60", "set preemption.signal"),
    ("--time=10", "set slurm.time_limit"),
])
def test_extra_directives_are_validated(directive, expect):
    data = {"slurm": {"extra_directives": [directive]}}
    if expect is None:
        assert profile_from_mapping(data, "p.yaml").slurm.extra_directives == [directive]
    else:
        (path, msg), = problems_of(data)
        assert path == "slurm.extra_directives[0]" and expect in msg


@pytest.mark.parametrize("field, value", [
    (("slurm", "account"), "acct`id`"),
    (("slurm", "qos"), "a b"),
    (("slurm", "constraint"), "a100;reboot"),
    (("slurm", "mem"), "80GB; id"),
    (("container", "image"), "img$(id)"),
    (("container", "mounts"), ["/a:/b;id"]),
    (("modules",), ["cuda/12 && id"]),
    (("storage", "checkpoint_root"), "/ckpt/$(id)"),
])
def test_shell_metacharacters_are_refused(field, value):
    data: dict = {}
    node = data
    for key in field[:-1]:
        node = node.setdefault(key, {})
    node[field[-1]] = value
    probs = problems_of(data)
    assert probs and all("not a valid" in m for _, m in probs), probs


def test_cross_checks():
    probs = dict(problems_of({
        "slurm": {"gpus_per_node": 8, "time_limit": "00:10:00"},
        "node": {"gpus": 4},
        "preemption": {"lead_time_s": 600},
        "interconnect": {"kind": "infiniband"},
    }))
    assert "node.gpus says a node has 4" in probs["slurm.gpus_per_node"]
    assert "not shorter than slurm.time_limit" in probs["preemption.lead_time_s"]
    assert "must name its HCAs" in probs["interconnect.hcas"]


def test_local_profile_is_single_node(tmp_path):
    """The local backend refuses a two-node profile (what it can give is the backend's to say),
    wherever the profile is used or checked."""
    from hpctrain.scheduler.choose import backend_for
    assert profile_from_mapping({"scheduler": "local", "slurm": {"nodes": 2}}, "p.yaml")
    two = load_profile("local").with_nodes(2)
    with pytest.raises(UsageError, match=r"slurm\.nodes: a local profile runs on this machine "
                                         r"only; set it to 1"):
        backend_for(two)
    backend_for(load_profile("local"))
    path = tmp_path / "two.yaml"
    path.write_text("scheduler: local\nslurm: {nodes: 2}\n")
    proc = hpctrain("profiles", "validate", str(path))
    assert proc.returncode == 2 and "slurm.nodes" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_profile_search_path_and_unknown_name(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"description": "from the env path",
                                                         "slurm": {"partition": "x"}}))
    monkeypatch.setenv("HPCTRAIN_PROFILE_PATH", str(tmp_path))
    assert "mine" in list_profiles()
    assert load_profile("mine").description == "from the env path"
    with pytest.raises(UsageError, match="unknown profile 'devslurm' \\(did you mean 'dev-slurm'"):
        load_profile("devslurm")


def test_cli_validate_reports_and_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("slurm:\n  partiton: gpu\n  gpus_per_node: four\n")
    proc = hpctrain("profiles", "validate", str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "slurm.partiton: unknown key (did you mean 'partition'?)" in proc.stderr
    assert "slurm.gpus_per_node: expected an integer, got 'four'" in proc.stderr


def test_cli_invalid_yaml_is_one_line(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("slurm: [1,\n")
    proc = hpctrain("profiles", "validate", str(bad))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and "invalid YAML at line 2" in err


def test_cli_list_and_show():
    proc = hpctrain("profiles", "list", "--json", check=True)
    names = {p["name"] for p in yaml.safe_load(proc.stdout)}
    assert set(SHIPPED) <= names
    shown = yaml.safe_load(hpctrain("profiles", "show", "dev-slurm", check=True).stdout)
    assert shown["slurm"]["partition"] == "debug"
    assert shown["preemption"]["signal"] == "USR1"   # a default, filled in
