"""Job files and the layout cross-checks, reported with the field to change."""

from __future__ import annotations

import copy

import pytest
import yaml

from hpctrain.config import job_from_mapping, load_job, load_profile, resolve
from hpctrain.errors import ConfigError
from tests.conftest import REPO, hpctrain

TINY = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())


def job(**changes) -> dict:
    data = copy.deepcopy(TINY)
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return data


def layout_problems(data: dict, profile="local", nodes=None) -> dict[str, str]:
    j = job_from_mapping(data, "job.yaml")
    with pytest.raises(ConfigError) as err:
        resolve(j, load_profile(profile).with_nodes(nodes))
    merged: dict[str, str] = {}
    for path, msg in err.value.problems:
        merged[path] = f"{merged[path]} | {msg}" if path in merged else msg
    return merged


@pytest.mark.parametrize("example, profile", [("tiny.yaml", "local"), ("tiny.yaml", "dev-slurm"),
                                              ("llama2-7b.yaml", "h100-ib-pyxis"),
                                              ("llama2-7b.yaml", "a100-roce")])
def test_examples_resolve(example, profile):
    r = resolve(load_job(REPO / "examples" / example), load_profile(profile))
    assert r.layout.world_size == r.profile.world_size


def test_relative_paths_resolve_against_the_job_file():
    j = load_job(REPO / "examples" / "tiny.yaml")
    assert [e.path for e in j.data.blend] == [str(REPO / "examples" / "data" / "kjv_byte"),
                                             str(REPO / "examples" / "data" / "python_docs_byte")]
    assert j.data.blend[0].prepare_from == [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]
    j = load_job(REPO / "examples" / "tiny-dp.yaml")
    assert j.data.path == str(REPO / "examples" / "data" / "kjv_byte")
    assert j.data.prepare_from == [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]


def test_world_size_must_factor():
    probs = layout_problems(job(parallel__tensor_model_parallel_size=3))
    assert "does not divide the world size (4" in probs["parallel.tensor_model_parallel_size"]


def test_heads_groups_and_ffn_divisible_by_tp():
    probs = layout_problems(job(model__num_attention_heads=6, model__hidden_size=192,
                                model__num_query_groups=3, parallel__virtual_pipeline_model_parallel_size=None,
                                parallel__pipeline_model_parallel_size=1, parallel__tensor_model_parallel_size=4),
                            profile="local")
    msg = probs["parallel.tensor_model_parallel_size"]
    assert "num_attention_heads (6)" in msg or "num_query_groups (3)" in msg


def test_layers_split_over_pp_times_vpp():
    probs = layout_problems(job(model__num_layers=6))
    assert "6 layers do not split evenly over PP (2) × VPP (2) = 4" in probs["model.num_layers"]


def test_vpp_needs_pp():
    probs = layout_problems(job(parallel__pipeline_model_parallel_size=1,
                                parallel__tensor_model_parallel_size=2))
    assert "needs pipeline_model_parallel_size > 1" in \
        probs["parallel.virtual_pipeline_model_parallel_size"]


def test_interleaving_needs_microbatches_divisible_by_pp():
    probs = layout_problems(job(batch__global_batch_size=12, batch__micro_batch_size=4))
    assert "microbatches (3) to be divisible by PP (2)" in probs["batch.global_batch_size"]


def test_global_batch_divisible_by_micro_times_dp():
    data = job(parallel__tensor_model_parallel_size=1, parallel__pipeline_model_parallel_size=1,
               parallel__virtual_pipeline_model_parallel_size=None, batch__global_batch_size=10,
               batch__micro_batch_size=4)
    probs = layout_problems(data)
    assert "not divisible by micro_batch_size (4) × DP (4) = 16" in probs["batch.global_batch_size"]


def test_sequence_parallel_needs_tp():
    data = job(parallel__tensor_model_parallel_size=1, parallel__sequence_parallel=True)
    probs = layout_problems(data)
    assert probs["parallel.sequence_parallel"] == "needs tensor_model_parallel_size > 1"


def test_tp_stays_inside_a_node():
    data = job(parallel__tensor_model_parallel_size=4, parallel__pipeline_model_parallel_size=1,
               parallel__virtual_pipeline_model_parallel_size=None)
    probs = layout_problems(data, profile="dev-slurm")   # 2 nodes x 2 GPUs
    assert "spans more than one node" in probs["parallel.tensor_model_parallel_size"]


def test_schema_errors_and_did_you_mean():
    data = job()
    data["model"]["num_layer"] = 4
    data["train"]["precision"] = "bf32"
    with pytest.raises(ConfigError) as err:
        job_from_mapping(data, "job.yaml")
    probs = dict(err.value.problems)
    assert "did you mean 'num_layers'" in probs["model.num_layer"]
    assert "expected one of bf16, fp16, fp32, got 'bf32'" in probs["train.precision"]


def test_cli_validate_job_exit_codes(tmp_path):
    ok = hpctrain("validate", "examples/tiny.yaml", "--profile", "dev-slurm", check=True)
    assert "TP2×PP2×VPP2×DP1" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(job(model__num_layers=6, batch__global_batch_size=12)))
    proc = hpctrain("validate", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "model.num_layers" in proc.stderr and "batch.global_batch_size" in proc.stderr


def test_cli_nodes_override_changes_the_layout_check():
    proc = hpctrain("validate", "examples/tiny.yaml", "--profile", "dev-slurm", "--nodes", "3")
    assert proc.returncode == 2
    assert "world size (6" in proc.stderr


@pytest.mark.parametrize("name, said", [
    ("", "missing: every job needs a name"),
    ("-rf", "is not a valid job name"),          # its run ids would read as options
    (".hidden", "is not a valid job name"),      # its run folders would be hidden
])
def test_a_job_name_that_cannot_start_a_run_id_is_refused(name, said):
    with pytest.raises(ConfigError) as err:
        job_from_mapping(job(name=name), "job.yaml")
    assert any(path == "name" and said in msg for path, msg in err.value.problems), \
        err.value.problems


@pytest.mark.parametrize("name, said", [
    (True, "expected a string, got true"),
    ("a\nb", "holds a line feed"),
    ("x" * 5000, "the limit is 4,096"),
    (None, "missing"),
])
def test_a_wrong_job_name_is_one_problem_not_also_missing(name, said):
    """The name the schema refused is reported once, as what is wrong with it; it is not
    also "missing" (it was given)."""
    data = job(name=name)
    if name is None:
        del data["name"]
    with pytest.raises(ConfigError) as err:
        job_from_mapping(data, "job.yaml")
    (problem,) = [msg for path, msg in err.value.problems if path == "name"]
    assert said in problem, err.value.problems
    assert len(err.value.problems) == 1 and "\n" not in str(err.value), str(err.value)


def test_an_empty_profile_option_is_not_the_default_profile(tmp_path):
    """`-p "$UNSET"` must not train on this machine (the default profile, local)."""
    proc = hpctrain("render", str(REPO / "examples" / "tiny.yaml"), "-p", "",
                    "--runs-dir", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().startswith("Error: unknown profile ''")


def test_a_job_whose_save_cannot_fit_the_cpu_profiles_host_memory_is_refused_in_one_line():
    """On a profile without GPU memory (the CPU rehearsal) the step's fit is unknown, but a
    checkpoint save larger than the host's memory is known not to fit: said, not a crash.
    (A model of 1.6 T parameters: its save needs tens of TiB of host memory on any machine.)"""
    proc = hpctrain("validate", str(REPO / "examples" / "tiny.yaml"),
                    "--set", "model.hidden_size=16384", "--set", "model.num_layers=512",
                    "--set", "model.ffn_hidden_size=65536")
    assert proc.returncode == 2 and "internal error" not in proc.stderr, proc.stderr
    assert "the checkpoint save does NOT fit" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "or pass --force to submit anyway" in proc.stderr
